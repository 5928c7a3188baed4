// DOM for the GradViz tab. Every name shown (run, layer, tensor) is data from
// the log directory: it goes in with textContent or setAttribute, never as HTML.

import * as model from './model.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

// ------------------------------------------------------------ DOM helpers

/** An HTML element; `text` is set as textContent, `attrs` with setAttribute. */
export function html(tag, {className, text, attrs} = {}, children = []) {
  const node = document.createElement(tag);
  return fill(node, className, text, attrs, children);
}

function svg(tag, {className, text, attrs} = {}, children = []) {
  const node = document.createElementNS(SVG_NS, tag);
  return fill(node, className, text, attrs, children);
}

function fill(node, className, text, attrs, children) {
  if (className) node.setAttribute('class', className);
  if (text !== undefined) node.textContent = text;
  for (const [key, value] of Object.entries(attrs ?? {})) node.setAttribute(key, String(value));
  for (const child of children) if (child) node.append(child);
  return node;
}

function tooltip(text) {
  return svg('title', {text});
}

function round(value) {
  return Math.round(value * 10) / 10;
}

// ------------------------------------------------------------ page layout

/**
 * Builds the page and returns its controls and containers. Controls are
 * native elements inside their <label>, so they work from the keyboard and
 * are named for screen readers (and for the browser tests).
 */
export function createLayout(root) {
  // <label for>, not a wrapping label: a wrapping label's name would take in the
  // select's current option ("Layer pool (MaxPooling2D)").
  const labelled = (text, control, className) => {
    control.id = `gradviz-${control.name}`;
    return html('span', {className: `control ${className ?? ''}`}, [
      html('label', {className: 'label-text', text, attrs: {for: control.id}}), control]);
  };

  const runSelect = html('select', {attrs: {name: 'run'}});
  const layerSelect = html('select', {attrs: {name: 'layer'}});
  const stepSlider = html('input', {attrs: {type: 'range', name: 'step', min: 0, max: 0, step: 1, value: 0}});
  const stepOutput = html('output', {className: 'step-value', attrs: {'aria-live': 'polite'}});
  const logToggle = html('input', {attrs: {type: 'checkbox', name: 'log-counts'}});
  const reloadButton = html('button', {text: 'Reload', attrs: {type: 'button'}});
  const compareTensorSelect = html('select', {attrs: {name: 'compare-tensor'}});
  const compareRunSelect = html('select', {attrs: {name: 'compare-run'}});

  const controls = html('header', {className: 'toolbar'}, [
    labelled('Run', runSelect),
    labelled('Layer', layerSelect, 'layer-control'),
    html('div', {className: 'step-control'}, [labelled('Step', stepSlider), stepOutput]),
    labelled('Log count axis', logToggle, 'toggle'),
    reloadButton,
  ]);

  const status = html('p', {className: 'status', attrs: {role: 'status'}});
  const layerTitle = html('h2', {className: 'layer-title'});
  const panels = html('div', {className: 'panels'});
  const aside = html('aside', {className: 'explanation'});
  const heatmaps = html('div', {className: 'heatmaps'});
  const gridTitle = html('h2', {text: 'All layers'});
  const grid = html('div', {className: 'grid-container'});
  const compareCharts = html('div', {className: 'compare-charts'});

  const page = html('main', {className: 'gradviz'}, [
    controls,
    status,
    html('section', {className: 'layer-section'}, [
      layerTitle,
      html('div', {className: 'layer-view'}, [
        html('div', {className: 'layer-main'}, [
          panels,
          html('h2', {text: 'Distribution over steps'}),
          html('p', {className: 'hint', text:
            'Each column is one logged step; rows are magnitude bins, positive values above the '
            + 'middle row of exact zeros, negative below. Darker means a larger share of the elements.'}),
          heatmaps,
        ]),
        aside,
      ]),
    ]),
    html('section', {}, [gridTitle, grid]),
    html('section', {}, [
      html('h2', {text: 'Compare runs'}),
      html('div', {className: 'toolbar'}, [
        labelled('Tensor', compareTensorSelect),
        labelled('Against run', compareRunSelect),
      ]),
      compareCharts,
    ]),
  ]);
  root.replaceChildren(page);
  return {
    runSelect, layerSelect, stepSlider, stepOutput, logToggle, reloadButton,
    compareTensorSelect, compareRunSelect,
    status, layerTitle, panels, aside, heatmaps, gridTitle, grid, compareCharts,
  };
}

/** Replaces a select's options, keeping `selected` when it is still offered. */
export function setOptions(select, options, selected) {
  select.replaceChildren(...options.map(({value, label}) => {
    const option = html('option', {text: label ?? value});
    option.value = value;
    return option;
  }));
  if (options.some((option) => option.value === selected)) select.value = selected;
  select.disabled = options.length === 0;
}

export function showStatus(status, message, isError = false) {
  status.textContent = message;
  status.classList.toggle('error', isError);
  status.hidden = !message;
}

// ------------------------------------------------------------ layer view

const ROLE_TITLES = {
  activation: 'Activation',
  input_gradient: 'Gradient w.r.t. input',
  output_gradient: 'Gradient w.r.t. output',
};

/** Where a tensor comes from, named as the backend that wrote the run names the ops. */
function producedBy(role, layer) {
  const type = layer.pooling?.type;
  const ops = type === 'max' ? (MAX_POOL_OPS[layer.backend] ?? MAX_POOL_OPS.tensorflow)
    : type === 'average' && (layer.backend ?? 'tensorflow') === 'tensorflow' ? {forward: 'AvgPool', backward: 'AvgPoolGrad'}
      : null;
  const forward = ops?.forward ?? layer.layer_class ?? 'layer';
  if (role === 'activation') return `${forward} output (forward pass)`;
  if (role === 'input_gradient') return ops ? `${ops.backward} output (backward pass)` : 'passed to the layer below (backward)';
  return ops ? `upstream gradient, ${ops.backward}'s input` : 'upstream gradient from the layer above';
}

export function renderLayerTitle(title, layer, step) {
  const parts = [layer.layer_class, model.describePooling(layer.pooling), step === null ? '' : `step ${step}`];
  title.replaceChildren(
    html('span', {className: 'layer-name', text: layer.layer}),
    html('span', {className: 'layer-meta', text: parts.filter(Boolean).join(' · ')}),
  );
}

/**
 * One panel per tensor of the layer at one step.
 *
 * @param {object[]} tensors `{info, series}` per tensor, `info` from /runs.
 * @param {{step: number, logarithmic: boolean}} options
 */
export function renderPanels(container, layer, tensors, {step, logarithmic}) {
  container.replaceChildren(...tensors.map(({info, series}) => {
    const snapshot = series && model.snapshotAt(series, step);
    return tensorPanel(layer, info, series, snapshot, logarithmic);
  }));
}

function tensorPanel(layer, info, series, snapshot, logarithmic) {
  const role = model.tensorRole(info.tensor);
  const suffix = info.tensor === role ? '' : ` ${info.tensor.slice(role.length + 1)}`;
  const panel = html('article', {
    className: `panel role-${role}`,
    attrs: {'data-tensor': info.tensor, 'aria-label': `${ROLE_TITLES[role] ?? info.tensor}${suffix}`},
  }, [
    html('header', {}, [
      html('h3', {text: `${ROLE_TITLES[role] ?? info.tensor}${suffix}`}),
      html('p', {className: 'produced-by', text: producedBy(role, layer)}),
      html('p', {className: 'shape'}, [
        html('span', {className: 'side', text: model.tensorSide(role)}),
        html('span', {className: 'shape-value', text: ` ${model.formatShape(info.shape)}`}),
        html('span', {className: 'dtype', text: ` ${info.dtype ?? ''}`}),
      ]),
    ]),
  ]);
  if (!snapshot) {
    panel.append(html('p', {className: 'empty', text: 'No value logged at or before this step.'}));
    return panel;
  }
  // Axes span every step of the series, so that moving the slider moves the
  // bars, not the axes.
  const range = model.padToDecades(model.seriesRange(series), series.log.edges);
  const yMax = Math.max(1, ...series.log.negative.flat(), ...series.log.positive.flat());
  panel.dataset.step = snapshot.step;
  panel.append(
    massBar(snapshot),
    histogram({
      negative: snapshot.negative, positive: snapshot.positive, total: snapshot.stats.count,
      edges: series.log.edges, range, yMax, logarithmic,
    }),
    statsList(snapshot.stats),
  );
  return panel;
}

/** The split of all elements: exact zeros, negative, positive, non-finite. */
function massBar(snapshot) {
  const {stats} = snapshot;
  const sum = (bins) => bins.reduce((a, b) => a + b, 0);
  const parts = [
    ['zeros', 'exact zeros', stats.zeros],
    ['negative', 'negative', sum(snapshot.negative)],
    ['positive', 'positive', sum(snapshot.positive)],
    ['nonfinite', 'NaN / ±Inf', model.nonFiniteCount(stats)],
  ];
  const bar = html('div', {className: 'mass-bar', attrs: {'aria-hidden': 'true'}});
  const legend = html('ul', {className: 'mass-legend'});
  for (const [key, label, count] of parts) {
    const fraction = stats.count > 0 ? count / stats.count : 0;
    if (count > 0) {
      const segment = html('span', {className: `segment ${key}`, attrs: {title: `${label}: ${model.formatCount(count)}`}});
      segment.style.width = `${fraction * 100}%`;
      bar.append(segment);
    }
    if (key === 'nonfinite' && count === 0) continue;
    legend.append(html('li', {className: key}, [
      html('span', {className: 'swatch'}),
      html('span', {text: `${label} `}),
      html('strong', {text: model.formatPercent(fraction)}),
    ]));
  }
  return html('div', {className: 'mass'}, [
    html('p', {className: 'zero-headline'}, [
      html('strong', {className: 'zero-fraction', text: model.formatPercent(model.zeroFraction(stats))}),
      html('span', {text: ` exact zeros (${model.formatCount(stats.zeros)} of ${model.formatCount(stats.count)})`}),
    ]),
    bar,
    legend,
  ]);
}

function statsList(stats) {
  const entries = [
    ['count', model.formatCount(stats.count)],
    ['zeros', model.formatCount(stats.zeros)],
    ['min', model.formatNumber(stats.min)],
    ['max', model.formatNumber(stats.max)],
    ['mean', model.formatNumber(stats.mean)],
    ['std', model.formatNumber(stats.std)],
    ['sum', model.formatNumber(stats.sum)],
    ['NaN', model.formatCount(stats.nan)],
    ['+Inf', model.formatCount(stats.pos_inf)],
    ['−Inf', model.formatCount(stats.neg_inf)],
  ];
  return html('dl', {className: 'stats'}, entries.flatMap(([name, value]) => {
    const alarming = ['NaN', '+Inf', '−Inf'].includes(name) && value !== '0';
    return [html('dt', {text: name}), html('dd', {text: value, className: alarming ? 'alarm' : undefined})];
  }));
}

// ------------------------------------------------------------ histogram

const HISTOGRAM = {width: 420, height: 190, left: 42, right: 10, top: 8, bottom: 34, gap: 14};

/**
 * The symmetric-log histogram of the non-zero values: negative magnitudes
 * mirrored to the left of a gap that stands for zero, positive to the right.
 */
export function histogram({negative, positive, total, edges, range, yMax, logarithmic, className = ''}) {
  const {width, height, left, right, top, bottom, gap} = HISTOGRAM;
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const chart = svg('svg', {
    className: `histogram ${className}`,
    attrs: {viewBox: `0 0 ${width} ${height}`, role: 'img'},
  });
  if (!range) {
    chart.setAttribute('aria-label', 'no non-zero finite values');
    chart.append(svg('text', {className: 'empty-text', text: 'no non-zero finite values',
      attrs: {x: width / 2, y: height / 2, 'text-anchor': 'middle'}}));
    return chart;
  }
  const bins = model.magnitudeBins(edges);
  const bars = model.signedBars(negative, positive, range);
  const half = bars.length / 2;
  const barWidth = (plotWidth - gap) / bars.length;
  const xOf = (i) => left + i * barWidth + (i >= half ? gap : 0);
  const yOf = (count) => top + plotHeight * (1 - model.countScale(count, yMax, logarithmic));

  const ticks = logarithmic ? model.logTicks(yMax) : model.linearTicks(yMax);
  for (const tick of ticks) {
    if (tick > yMax * 1.0001 && tick !== ticks[0]) continue;
    const y = round(yOf(tick));
    chart.append(
      svg('line', {className: 'gridline', attrs: {x1: left, x2: width - right, y1: y, y2: y}}),
      svg('text', {className: 'tick', text: model.formatCompactCount(tick),
        attrs: {x: left - 4, y: y + 3, 'text-anchor': 'end'}}),
    );
  }

  bars.forEach(({sign, bin, count}, i) => {
    if (!(count > 0)) return;
    const y = yOf(count);
    const share = total > 0 ? ` (${model.formatPercent(count / total, 2)} of all)` : '';
    chart.append(svg('rect', {
      className: `bar ${sign < 0 ? 'negative' : 'positive'}`,
      attrs: {x: round(xOf(i) + 0.5), y: round(y), width: round(Math.max(barWidth - 1, 0.5)),
        height: round(top + plotHeight - y)},
    }, [tooltip(`${model.binRangeLabel(bins, sign, bin)}: ${model.formatCount(count)}${share}`)]));
  });

  const baseline = top + plotHeight;
  chart.append(svg('line', {className: 'axis', attrs: {x1: left, x2: width - right, y1: baseline, y2: baseline}}));
  const zeroX = left + half * barWidth + gap / 2;
  chart.append(
    svg('line', {className: 'zero-line', attrs: {x1: zeroX, x2: zeroX, y1: top, y2: baseline}}),
    svg('text', {className: 'tick', text: '0', attrs: {x: zeroX, y: baseline + 13, 'text-anchor': 'middle'}}),
  );
  for (const {x, label} of magnitudeTicks(bins, range, {left, half, barWidth, gap})) {
    chart.append(
      svg('line', {className: 'axis', attrs: {x1: x, x2: x, y1: baseline, y2: baseline + 3}}),
      svg('text', {className: 'tick', text: label, attrs: {x, y: baseline + 13, 'text-anchor': 'middle'}}),
    );
  }
  chart.append(svg('text', {className: 'axis-title', text: 'value (log magnitude; zeros counted above)',
    attrs: {x: left + plotWidth / 2, y: height - 4, 'text-anchor': 'middle'}}));
  chart.setAttribute('aria-label', `histogram of the non-zero values, ${logarithmic ? 'log' : 'linear'} count axis`);
  return chart;
}

/**
 * Decade labels on both sides of the zero gap, thinned to about four a side.
 * Bars are contiguous on each side: the boundary `k` bins away from the gap
 * is at the same distance from it on both sides.
 */
function magnitudeTicks(bins, range, {left, half, barWidth, gap}) {
  const decades = [];
  for (let offset = 0; offset <= range.last - range.first + 1; offset++) {
    const bin = range.first + offset;
    const edge = bin <= range.last ? bins[bin].low : bins[range.last].high;
    // The innermost boundary is left to the "0" label, which it would overlap.
    if (offset > 0 && edge > 0 && Number.isFinite(edge) && model.isDecade(edge)) decades.push({offset, edge});
  }
  const every = Math.max(1, Math.ceil(decades.length / 4));
  const ticks = [];
  decades.forEach(({offset, edge}, i) => {
    if ((decades.length - 1 - i) % every !== 0) return;
    const label = model.edgeLabel(edge);
    ticks.push({x: round(left + (half + offset) * barWidth + gap), label});
    ticks.push({x: round(left + (half - offset) * barWidth), label: `−${label}`});
  });
  return ticks;
}

// ------------------------------------------------------------ routing and explanation

/** Routing statistics and the explanation of the panels, beside them. */
export function renderAside(aside, layer, routing) {
  const children = [];
  if (routing) children.push(routingCard(layer, routing));
  children.push(explanation(layer));
  aside.replaceChildren(...children);
}

function routingCard(layer, routing) {
  const count = model.formatCount;
  const routed = model.routedFraction(routing);
  const predicted = model.predictedRoutedFraction(routing, layer.pooling);
  const {mass} = routing;  // the server's verdict, the same as tb-gradviz summary's
  const scale = model.formatNumber(routing.output_gradient_abs_sum, 2);
  const rows = [
    ['Routed', `${model.formatPercent(routed)} of input positions (${count(routing.routed_positions)} of ${count(routing.input_positions)})`],
  ];
  if (layer.pooling?.type === 'max') {
    rows.push(
      ['Predicted', `≤ ${model.formatPercent(predicted)} = windows / input positions (${count(routing.windows)} / ${count(routing.input_positions)})`],
      ['Tied windows', `${count(routing.tied_windows)} of ${count(routing.windows)}`],
    );
  } else {
    rows.push(['Predicted', 'every input position inside a window gets a share']);
  }
  rows.push(
    ['Σ grad input', model.formatNumber(routing.input_gradient_sum, 6)],
    ['Σ grad output', model.formatNumber(routing.output_gradient_sum, 6)],
  );
  const difference = model.formatNumber(Math.abs(mass.difference), 2);
  const verdict = mass.conserved === null
    ? '? Gradient mass: this record predates Σ|grad|, which the sums are judged against.'
    : mass.difference === 0 ? '✓ Gradient mass conserved: the sums are equal.' : mass.conserved
      ? `✓ Gradient mass conserved: the sums differ by ${difference}, rounding next to Σ|grad| ≈ ${scale}.`
      : `✗ Gradient mass not conserved: the sums differ by ${difference}, `
        + `${model.formatPercent(mass.relative, 2)} of Σ|grad| ≈ ${scale}.`;
  return html('section', {className: 'card routing'}, [
    html('h3', {text: `Routing at step ${routing.step}`}),
    html('dl', {}, rows.flatMap(([name, value]) => [html('dt', {text: name}), html('dd', {text: value})])),
    html('p', {className: mass.conserved ? 'verdict ok' : mass.conserved === null ? 'verdict' : 'verdict alarm', text: verdict}),
  ]);
}

const HISTOGRAM_NOTE = 'Exact zeros are counted apart (the striped bar); the histogram shows the non-zero '
  + 'values by log magnitude, negative mirrored to the left of 0.';

function maxPoolGeometry(pooling) {
  if (pooling.global) return 'This global pool has one window per map: one position per channel receives gradient.';
  const windows = `This layer's ${model.formatShape(pooling.pool_size)} windows with stride ${model.formatShape(pooling.strides)}`;
  return model.windowsOverlap(pooling)
    ? `${windows} overlap: one position can be the maximum of several windows, which leaves more zeros still.`
    : `${windows} do not overlap: each input position belongs to one window at most.`;
}

// What each Keras backend runs for a max pool, forward and in backprop.
const MAX_POOL_OPS = {
  tensorflow: {intro: 'In the TensorFlow graph a MaxPool layer is two ops: MaxPool in the forward pass, '
    + 'and MaxPoolGrad, which backprop runs.', forward: 'MaxPool', backward: 'MaxPoolGrad'},
  jax: {intro: 'On JAX, XLA runs a max pool as two ops: reduce_window (max) in the forward pass, '
    + 'and select_and_scatter_add, its gradient, in backprop.', forward: 'reduce_window', backward: 'select_and_scatter_add'},
  torch: {intro: 'On PyTorch a max pool is two kernels: max_pool in the forward pass, which also keeps '
    + 'the index of each maximum, and its backward, which scatters to those indices.',
  forward: 'max_pool', backward: 'max_pool\'s backward'},
};

function tieRule(layer) {
  const where = `${layer.backend ?? 'tensorflow'}${layer.device ? ` on ${layer.device}` : ''}`;
  const checked = (layer.device ?? 'cpu') === 'cpu'
    ? 'tb_gradviz\'s tests check this rule on the CPU for each backend'
    : 'checked on the CPU by tb_gradviz\'s tests, and seen on an H100 for XLA and PyTorch CUDA';
  return `when several positions of a window hold its maximum (whole windows of ReLU zeros, say), `
    + `this run's backend (${where}) sends the gradient to the first of them in raster order, `
    + `and only to it (${checked}).`;
}

function explanation(layer) {
  const type = layer.pooling?.type;
  let intro;
  let roles;
  if (type === 'max') {
    const ops = MAX_POOL_OPS[layer.backend] ?? MAX_POOL_OPS.tensorflow;
    intro = `Why two tensors? ${ops.intro}`;
    roles = [
      ['Activation', `${ops.forward}'s output: the maximum of each window.`],
      ['Gradient w.r.t. output', `the upstream gradient ${ops.backward} receives, one value per window.`],
      ['Gradient w.r.t. input', `${ops.backward}'s output. Each window's gradient goes to the position `
        + 'that held its maximum; every other position gets an exact zero. '
        + 'A 2×2 pool with stride 2 thus leaves 75 % zeros: geometry, not dead units. '
        + maxPoolGeometry(layer.pooling)],
      ['Ties', tieRule(layer)],
    ];
  } else if (type) {
    intro = 'An average pool is two ops: AvgPool forward, and AvgPoolGrad in backprop, which spreads each '
      + 'window\'s gradient evenly over the window, so pooling itself adds no zeros.';
    roles = [
      ['Activation', 'the window averages.'],
      ['Gradient w.r.t. output', 'the upstream gradient, one value per window.'],
      ['Gradient w.r.t. input', 'AvgPoolGrad\'s output, handed to the layer below.'],
    ];
  } else {
    intro = 'The forward output of the layer and the two gradients backprop computes around it.';
    roles = [
      ['Activation', 'the layer\'s output.'],
      ['Gradient w.r.t. output', 'the upstream gradient arriving from the layer above.'],
      ['Gradient w.r.t. input', 'what backprop hands to the layer below.'],
    ];
  }
  return html('section', {className: 'card'}, [
    html('h3', {text: 'What am I looking at?'}),
    html('p', {text: intro}),
    html('dl', {className: 'roles'}, roles.flatMap(([name, text]) => [html('dt', {text: name}), html('dd', {text})])),
    html('p', {className: 'hint', text: HISTOGRAM_NOTE}),
  ]);
}

// ------------------------------------------------------------ distribution over steps

const HEATMAP = {width: 420, height: 200, left: 46, right: 10, top: 8, bottom: 30};

/** One heatmap per tensor: magnitude bins (rows) over steps (columns). */
export function renderHeatmaps(container, tensors, step) {
  container.replaceChildren(...tensors.map(({info, series}) => {
    const role = model.tensorRole(info.tensor);
    const figure = html('figure', {className: `heatmap-figure role-${role}`, attrs: {'data-tensor': info.tensor}}, [
      html('figcaption', {text: info.tensor === role ? ROLE_TITLES[role] : `${ROLE_TITLES[role] ?? role} (${info.tensor})`}),
    ]);
    figure.append(series ? heatmap(series, step) : html('p', {className: 'empty', text: 'no data'}));
    return figure;
  }));
}

function heatmap(series, step) {
  const {width, height, left, right, top, bottom} = HEATMAP;
  const range = model.padToDecades(model.seriesRange(series), series.log.edges);
  const grid = model.distributionOverSteps(series, range);
  const bins = model.magnitudeBins(series.log.edges);
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const cellWidth = plotWidth / grid.steps.length;
  const cellHeight = plotHeight / grid.rows.length;
  const chart = svg('svg', {className: 'heatmap', attrs: {viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `share of elements per magnitude bin over ${grid.steps.length} steps`}});

  grid.rows.forEach(({sign, bin}, r) => {
    grid.cells[r].forEach((fraction, c) => {
      if (!(fraction > 0)) return;
      // Log shading: a bin holding 0.1 % should still be visible next to one holding 50 %.
      const intensity = Math.min(1, Math.max(0.12, (Math.log10(fraction) + 5) / 5));
      const cell = svg('rect', {
        className: `cell ${sign === 0 ? 'zeros' : sign < 0 ? 'negative' : 'positive'}`,
        attrs: {x: round(left + c * cellWidth), y: round(top + r * cellHeight),
          width: round(cellWidth + 0.3), height: round(cellHeight + 0.3), 'fill-opacity': intensity.toFixed(2)},
      });
      chart.append(cell);
    });
  });
  const rowLabels = grid.rows.map(({sign, bin}, r) => ({
    position: top + (r + 0.5) * cellHeight,
    text: sign === 0 ? '0' : heatmapRowLabel(bins, sign, bin),
    pinned: sign === 0,
  })).filter((label) => label.text);
  for (const {position, text} of model.spacedLabels(rowLabels, 12)) {
    chart.append(svg('text', {className: 'tick', text, attrs: {x: left - 4, y: round(position + 3), 'text-anchor': 'end'}}));
  }

  chart.append(svg('rect', {className: 'frame', attrs: {x: left, y: top, width: plotWidth, height: plotHeight}}));
  const first = grid.steps[0];
  const last = grid.steps[grid.steps.length - 1];
  chart.append(
    svg('text', {className: 'tick', text: String(first), attrs: {x: left, y: height - 16}}),
    svg('text', {className: 'tick', text: String(last), attrs: {x: width - right, y: height - 16, 'text-anchor': 'end'}}),
    svg('text', {className: 'axis-title', text: 'step', attrs: {x: left + plotWidth / 2, y: height - 4, 'text-anchor': 'middle'}}),
  );
  const column = model.latestIndexAtOrBefore(grid.steps, step);
  if (column >= 0) {
    const x = round(left + (column + 0.5) * cellWidth);
    chart.append(svg('line', {className: 'current-step', attrs: {x1: x, x2: x, y1: top, y2: top + plotHeight}},
      [tooltip(`step ${grid.steps[column]}`)]));
  }
  return chart;
}

/** The label of a row whose upper magnitude edge is a decade; '' for the others. */
function heatmapRowLabel(bins, sign, bin) {
  const edge = bins[bin].high;
  if (!Number.isFinite(edge) || !model.isDecade(edge)) return '';
  return `${sign < 0 ? '−' : ''}${model.edgeLabel(edge)}`;
}

// ------------------------------------------------------------ compare layers

const SPARK = {width: 120, height: 26};

/**
 * All layers of a run at one step (the `/step` answer) as a table: zero
 * fraction and a magnitude sparkline per tensor, routing for pooling layers.
 * `poolingOf(layer)` gives a layer's pooling from /runs; `onSelect(layer)` is
 * called when a layer name is activated.
 */
export function renderLayerGrid(container, title, snapshot, {currentLayer, poolingOf, onSelect}) {
  title.textContent = `All layers of ${snapshot.run} at step ${snapshot.step}`;
  // One axis per column: activations and gradients live decades apart.
  const ranges = Object.fromEntries(model.ROLES.map((role) => {
    const binLists = snapshot.layers.flatMap((layer) => Object.entries(layer.tensors)
      .filter(([name]) => model.tensorRole(name) === role)
      .flatMap(([, tensor]) => [tensor.log.negative, tensor.log.positive]));
    return [role, model.padToDecades(model.occupiedRange(binLists), snapshot.log_edges)];
  }));

  const head = html('thead', {}, [html('tr', {}, [
    html('th', {text: 'Layer', attrs: {scope: 'col'}}),
    html('th', {text: 'Class', attrs: {scope: 'col'}}),
    html('th', {text: 'Step', attrs: {scope: 'col'}}),
    ...model.ROLES.map((role) => html('th', {text: ROLE_TITLES[role], attrs: {scope: 'col'}})),
    html('th', {text: 'Routed (predicted)', attrs: {scope: 'col'}}),
  ])]);
  const body = html('tbody', {}, snapshot.layers.map((layer) => {
    const button = html('button', {className: 'link', text: layer.layer, attrs: {type: 'button'}});
    button.addEventListener('click', () => onSelect(layer.layer));
    const groups = model.tensorsByRole(Object.keys(layer.tensors));
    const row = html('tr', {className: layer.layer === currentLayer ? 'current' : undefined}, [
      html('th', {attrs: {scope: 'row'}}, [button]),
      html('td', {text: layer.layer_class ?? ''}),
      html('td', {className: 'number', text: String(layer.step)}),
      ...model.ROLES.map((role) => html('td', {className: 'tensor-cell'}, groups[role].map((name) =>
        gridTensor(name, role, layer.tensors[name], snapshot.log_edges, ranges[role])))),
      html('td', {className: 'number', text: routingSummary(layer.routing, poolingOf(layer.layer))}),
    ]);
    if (layer.layer === currentLayer) row.setAttribute('aria-current', 'true');
    return row;
  }));
  container.replaceChildren(html('table', {className: 'layer-grid'}, [head, body]));
}

function routingSummary(routing, pooling) {
  if (!routing) return '—';
  const routed = model.formatPercent(model.routedFraction(routing));
  const predicted = model.predictedRoutedFraction(routing, pooling);
  return Number.isNaN(predicted) ? routed : `${routed} (≤ ${model.formatPercent(predicted)})`;
}

function gridTensor(name, role, tensor, edges, range) {
  const zeros = model.zeroFraction(tensor.stats);
  const label = name === role ? '' : `${name.slice(role.length + 1)}: `;
  return html('div', {className: 'grid-tensor', attrs: {'data-tensor': name}}, [
    html('span', {className: 'grid-zeros', text: `${label}${model.formatPercent(zeros)} zeros`}),
    sparkline(tensor.log.negative, tensor.log.positive, edges, range),
  ]);
}

function sparkline(negative, positive, edges, range) {
  const {width, height} = SPARK;
  const chart = svg('svg', {className: 'sparkline', attrs: {viewBox: `0 0 ${width} ${height}`, width, height, 'aria-hidden': 'true'}});
  if (!range) return chart;
  const bars = model.signedBars(negative, positive, range);
  const max = Math.max(1, ...bars.map((bar) => bar.count));
  const barWidth = (width - 4) / bars.length;
  const bins = model.magnitudeBins(edges);
  bars.forEach(({sign, bin, count}, i) => {
    if (!(count > 0)) return;
    const barHeight = Math.max(1, (height - 2) * (count / max));
    chart.append(svg('rect', {
      className: `bar ${sign < 0 ? 'negative' : 'positive'}`,
      attrs: {x: round(i * barWidth + (i >= bars.length / 2 ? 4 : 0)), y: round(height - barHeight),
        width: round(Math.max(barWidth - 0.3, 0.5)), height: round(barHeight)},
    }, [tooltip(`${model.binRangeLabel(bins, sign, bin)}: ${model.formatCount(count)}`)]));
  });
  return chart;
}

// ------------------------------------------------------------ compare runs

const LINES = {width: 460, height: 190, left: 46, right: 12, top: 10, bottom: 34};

/**
 * The same tensor of one layer in two runs: the zero fraction over steps and
 * the magnitude histograms at the chosen step, as shares of all elements.
 *
 * @param {{run: string, series: object}[]} entries one or two runs.
 */
export function renderRunComparison(container, entries, step) {
  if (entries.length === 0) {
    container.replaceChildren(html('p', {className: 'empty', text: 'No tensor to compare.'}));
    return;
  }
  const legend = html('ul', {className: 'run-legend'}, entries.map(({run}, i) =>
    html('li', {className: `series-${i}`}, [html('span', {className: 'swatch'}), html('span', {text: run})])));
  container.replaceChildren(
    legend,
    html('div', {className: 'compare-row'}, [
      html('figure', {}, [html('figcaption', {text: 'Exact zeros over steps'}), zeroFractionChart(entries, step)]),
      html('figure', {}, [
        html('figcaption', {text: `Non-zero values at step ${step} (share of all elements)`}),
        overlayHistogram(entries, step),
      ]),
    ]),
  );
}

function zeroFractionChart(entries, step) {
  const {width, height, left, right, top, bottom} = LINES;
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const steps = model.unionSteps(entries.map(({series}) => series.steps));
  const first = steps[0];
  const last = steps[steps.length - 1];
  const xOf = (s) => left + (last > first ? (s - first) / (last - first) : 0.5) * plotWidth;
  const yOf = (fraction) => top + plotHeight * (1 - fraction);
  const chart = svg('svg', {className: 'lines', attrs: {viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': 'share of exact zeros over steps'}});
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    const y = round(yOf(tick));
    chart.append(
      svg('line', {className: 'gridline', attrs: {x1: left, x2: width - right, y1: y, y2: y}}),
      svg('text', {className: 'tick', text: `${tick * 100} %`, attrs: {x: left - 4, y: y + 3, 'text-anchor': 'end'}}),
    );
  }
  entries.forEach(({run, series}, i) => {
    const points = series.steps.map((s, k) => [xOf(s), yOf(series.stats.zeros[k] / series.stats.count[k])])
      .filter(([, y]) => Number.isFinite(y));
    if (points.length === 0) return;
    const path = points.map(([x, y], k) => `${k ? 'L' : 'M'}${round(x)},${round(y)}`).join('');
    chart.append(svg('path', {className: `line series-${i}`, attrs: {d: path}}, [tooltip(run)]));
    if (points.length <= 60) {
      for (const [x, y] of points) chart.append(svg('circle', {className: `dot series-${i}`, attrs: {cx: round(x), cy: round(y), r: 2.2}}));
    }
  });
  const x = round(xOf(Math.min(Math.max(step, first), last)));
  chart.append(
    svg('line', {className: 'current-step', attrs: {x1: x, x2: x, y1: top, y2: top + plotHeight}}),
    svg('text', {className: 'tick', text: String(first), attrs: {x: left, y: height - 16}}),
    svg('text', {className: 'tick', text: String(last), attrs: {x: width - right, y: height - 16, 'text-anchor': 'end'}}),
    svg('text', {className: 'axis-title', text: 'step', attrs: {x: left + plotWidth / 2, y: height - 4, 'text-anchor': 'middle'}}),
  );
  return chart;
}

function overlayHistogram(entries, step) {
  const {width, height, left, right, top, bottom} = LINES;
  const snapshots = entries.map(({series}) => model.snapshotAt(series, step));
  const edges = entries[0].series.log.edges;
  const range = model.padToDecades(model.occupiedRange(
    snapshots.filter(Boolean).flatMap((s) => [s.negative, s.positive])), edges);
  const chart = svg('svg', {className: 'histogram overlay', attrs: {viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': 'magnitude histograms of both runs'}});
  if (!range) {
    chart.append(svg('text', {className: 'empty-text', text: 'no non-zero values at this step',
      attrs: {x: width / 2, y: height / 2, 'text-anchor': 'middle'}}));
    return chart;
  }
  const bins = model.magnitudeBins(edges);
  const shares = snapshots.map((s) => s && model.signedBars(s.negative, s.positive, range)
    .map((bar) => ({...bar, share: s.stats.count > 0 ? bar.count / s.stats.count : 0})));
  const maxShare = Math.max(1e-9, ...shares.flat().filter(Boolean).map((bar) => bar.share));
  const count = shares.find(Boolean).length;
  const gap = 14;
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const barWidth = (plotWidth - gap) / count;
  const half = count / 2;
  const xOf = (i) => left + i * barWidth + (i >= half ? gap : 0);
  for (const tick of model.linearTicks(maxShare, 3)) {
    if (tick > maxShare * 1.0001 && tick !== 0) continue;
    const y = round(top + plotHeight * (1 - tick / maxShare));
    chart.append(
      svg('line', {className: 'gridline', attrs: {x1: left, x2: width - right, y1: y, y2: y}}),
      svg('text', {className: 'tick', text: model.formatPercent(tick, tick < 0.01 ? 2 : 1), attrs: {x: left - 4, y: y + 3, 'text-anchor': 'end'}}),
    );
  }
  shares.forEach((bars, s) => {
    if (!bars) return;
    const width = barWidth / entries.length;
    bars.forEach(({sign, bin, share}, i) => {
      if (!(share > 0)) return;
      const barHeight = plotHeight * (share / maxShare);
      chart.append(svg('rect', {className: `bar series-${s}`, attrs: {
        x: round(xOf(i) + s * width), y: round(top + plotHeight - barHeight),
        width: round(Math.max(width - 0.4, 0.5)), height: round(barHeight)},
      }, [tooltip(`${entries[s].run}: ${model.binRangeLabel(bins, sign, bin)}: ${model.formatPercent(share, 2)}`)]));
    });
  });
  const baseline = top + plotHeight;
  chart.append(svg('line', {className: 'axis', attrs: {x1: left, x2: width - right, y1: baseline, y2: baseline}}));
  for (const {x, label} of magnitudeTicks(bins, range, {left, half, barWidth, gap})) {
    chart.append(svg('text', {className: 'tick', text: label, attrs: {x, y: baseline + 13, 'text-anchor': 'middle'}}));
  }
  const zeroX = left + half * barWidth + gap / 2;
  chart.append(svg('text', {className: 'tick', text: '0', attrs: {x: zeroX, y: baseline + 13, 'text-anchor': 'middle'}}));
  return chart;
}
