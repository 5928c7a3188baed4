// DOM of the layer view: one panel per tensor, the routing card and
// explanation beside them, the heatmaps below. The weights row is in
// weightsview.js, the layer grid and the run comparison in compare.js.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {definitionList, html, round, svg} from './dom.js';

// ------------------------------------------------------------ layer view

export function renderLayerTitle(title, layer, step) {
  const parts = [layer.layer_class, captions.describePooling(layer.pooling), step === null ? '' : `step ${step}`];
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
  return panelsDrawn(container);
}

/** Resolves once every panel in `container` has drawn its step (a pending record fetched). */
export function panelsDrawn(container) {
  return Promise.all([...container.querySelectorAll('.panel')].map((panel) => panel.drawing));
}

/**
 * The largest magnitude-bin count of a series over every step, at least 1. A
 * loop, not `Math.max(...counts)`: a long run has more counts than a call may
 * take arguments.
 */
export function largestCount({negative, positive}) {
  let largest = 1;
  for (const steps of [negative, positive]) {
    for (const counts of steps) {
      for (const count of counts) {
        if (count > largest) largest = count;
      }
    }
  }
  return largest;
}

/** The panel of one tensor at one step (`snapshot`, null: none at or before it). */
export function tensorPanel(layer, info, series, snapshot, logarithmic) {
  const title = captions.tensorTitle(info, layer.tensors);
  const panel = html('article', {
    className: `panel role-${info.role}`,
    attrs: {'data-tensor': info.tensor, 'aria-label': title},
  }, [
    html('header', {}, [
      html('h3', {text: title}),
      html('p', {className: 'produced-by', text: captions.producedBy(info.role, layer)}),
      html('p', {className: 'shape'}, [
        html('span', {className: 'side', text: captions.tensorSide(info.role)}),
        html('span', {className: 'shape-value', text: ` ${model.formatShape(info.shape)}`}),
        html('span', {className: 'dtype', text: ` ${info.dtype ?? ''}`}),
      ]),
    ]),
  ]);
  if (!snapshot) {
    panel.append(html('p', {className: 'empty', text: 'No value logged at or before this step.'}));
    return panel;
  }
  if (snapshot.pending) {
    // A downsampled series: the record of this step is fetched, then the panel drawn again.
    const note = html('p', {className: 'empty', text: `Loading step ${snapshot.step}…`});
    panel.append(note);
    panel.drawing = model.loadRecord(series, snapshot.step).then(() => {
      if (panel.isConnected) {
        panel.replaceWith(tensorPanel(layer, info, series, model.snapshotAt(series, snapshot.step), logarithmic));
      }
    }, (error) => {
      note.textContent = `Could not load step ${snapshot.step}: ${error.message}`;
    });
    return panel;
  }
  // Axes span every step of the series, so that moving the slider moves the
  // bars, not the axes.
  const range = model.padToDecades(model.seriesRange(series), series.log.edges);
  const yMax = largestCount(series.log);
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

const HISTOGRAM = charts.chartBox({width: 420, height: 190, left: 42, right: 10, top: 8, bottom: 34});
// The gap between negative and positive bars, which stands for zero.
const ZERO_GAP = 14;

/**
 * The symmetric-log histogram of the non-zero values: negative magnitudes
 * mirrored to the left of a gap that stands for zero, positive to the right.
 */
function histogram({negative, positive, total, edges, range, yMax, logarithmic}) {
  const box = HISTOGRAM;
  if (!range) {
    const chart = charts.chartFrame(box, {className: 'histogram', label: 'no non-zero finite values'});
    charts.emptyMessage(chart, box, 'no non-zero finite values');
    return chart;
  }
  const chart = charts.chartFrame(box, {className: 'histogram',
    label: `histogram of the non-zero values, ${logarithmic ? 'log' : 'linear'} count axis`});
  const heightOf = (count) => box.plotHeight * model.countScale(count, yMax, logarithmic);
  charts.valueAxis(chart, box, {
    ticks: logarithmic ? model.logTicks(yMax) : model.linearTicks(yMax), max: yMax,
    yOf: (tick) => box.baseline - heightOf(tick), label: model.formatCompactCount,
  });
  const bins = model.magnitudeBins(edges);
  const bars = model.signedBars(negative, positive, range);
  const slots = charts.signedSlots(box, bars.length, ZERO_GAP);
  charts.drawSignedBars(chart, box, slots, bars, {
    heightOf: ({count}) => heightOf(count),
    title: ({sign, bin, count}) => `${model.binRangeLabel(bins, sign, bin)}: ${model.formatCount(count)}`
      + (total > 0 ? ` (${model.formatPercent(count / total, 2)} of all)` : ''),
  });
  chart.append(svg('line', {className: 'zero-line',
    attrs: {x1: slots.zeroX, x2: slots.zeroX, y1: box.top, y2: box.baseline}}));
  charts.magnitudeAxis(chart, box, slots, bins, range);
  charts.axisTitle(chart, box, 'value (log magnitude; zeros counted above)');
  return chart;
}

// ------------------------------------------------------------ routing and explanation

/** Routing statistics and the explanation of the panels, beside them. */
export function renderAside(aside, layer, routing) {
  const children = [];
  if (routing) children.push(routingCard(layer, routing));
  children.push(explanationCard(layer));
  aside.replaceChildren(...children);
}

function routingCard(layer, routing) {
  const {title, rows, verdict} = captions.routingSummary(layer, routing);
  const state = verdict.conserved ? ' ok' : verdict.conserved === null ? '' : ' alarm';
  return html('section', {className: 'card routing'}, [
    html('h3', {text: title}),
    definitionList(rows),
    html('p', {className: `verdict${state}`, text: verdict.text}),
  ]);
}

function explanationCard(layer) {
  const {intro, roles} = captions.explanation(layer);
  return html('section', {className: 'card'}, [
    html('h3', {text: 'What am I looking at?'}),
    html('p', {text: intro}),
    definitionList(roles, 'roles'),
    html('p', {className: 'hint', text: captions.HISTOGRAM_NOTE}),
  ]);
}

// ------------------------------------------------------------ distribution over steps

const HEATMAP = charts.chartBox({width: 420, height: 200, left: 46, right: 10, top: 8, bottom: 30});
const SPREAD = charts.chartBox({width: 420, height: 120, left: 46, right: 10, top: 14, bottom: 30});

/**
 * One heatmap per tensor of the layer, magnitude bins (rows) over steps
 * (columns), and under it the tensor's spread over steps. `onStep(step)`:
 * a click on the spread chose that step.
 */
export function renderHeatmaps(container, layer, tensors, step, onStep) {
  container.replaceChildren(...tensors.map(({info, series}) => html('figure', {
    className: `heatmap-figure role-${info.role}`, attrs: {'data-tensor': info.tensor},
  }, series ? [
    html('figcaption', {text: captions.tensorTitle(info, layer.tensors)}),
    heatmap(series, step),
    spreadOverSteps(series, step, onStep),
  ] : [
    html('figcaption', {text: captions.tensorTitle(info, layer.tensors)}),
    html('p', {className: 'empty', text: 'no data'}),
  ])));
}

// The grid of style.css' `.heatmaps`: figures of at least this width, this far apart.
const FIGURE_MIN_WIDTH = 300;
const FIGURE_GAP = 12;

/**
 * The width, in CSS pixels, of the plots over steps in `container`: the
 * columns to ask /series for (rounded up to 100, so that a few pixels do not
 * fetch again). Before any is drawn, that of a figure in a full row of the
 * container's grid; undefined (the server's default) while it is not laid out.
 */
export function overStepsWidth(container) {
  const drawn = container.querySelector('svg.spread');
  let width = drawn?.getBoundingClientRect().width;
  if (!width) {
    const outer = container.getBoundingClientRect().width;
    const perRow = Math.max(1, Math.floor((outer + FIGURE_GAP) / (FIGURE_MIN_WIDTH + FIGURE_GAP)));
    width = (outer - FIGURE_GAP * (perRow - 1)) / perRow;
  }
  const plot = width * (SPREAD.plotWidth / SPREAD.width);
  return plot > 0 ? Math.ceil(plot / 100) * 100 : undefined;
}

/**
 * The standard deviation of a tensor over steps, on a log axis: a band from
 * each column's smallest to its largest value, so that a spike at one step of
 * thousands shows. Hovering names the column's steps and values; a click
 * calls `onStep` with its last step.
 */
function spreadOverSteps(series, step, onStep) {
  const box = SPREAD;
  const {first, last, low, high} = model.fieldOverSteps(series, 'std');
  const count = first.length;
  const chart = charts.chartFrame(box, {className: 'spread',
    label: `standard deviation over ${series.steps.length} steps, in ${count} columns`});
  chart.dataset.columns = count;
  const range = flowmodel.logRange([low, high]);
  if (!range) {
    charts.emptyMessage(chart, box, 'no finite non-zero spread');
    return chart;
  }
  const yOf = charts.logScale(range, {bottom: box.baseline, height: box.plotHeight, zeroY: box.baseline});
  charts.logAxis(chart, box, {range, yOf, zeroY: box.baseline, zeros: false, maxTicks: 4});
  const xOf = (k) => box.left + (k / count) * box.plotWidth;
  const positive = (value) => value > 0 && Number.isFinite(value);
  charts.drawBand(chart, {
    count, xOf, className: 'band',
    // A column whose smallest spread is 0 reaches down to the axis.
    lowY: (k) => (positive(low[k]) ? yOf(low[k]) : positive(high[k]) ? box.baseline : NaN),
    highY: (k) => (positive(high[k]) ? yOf(high[k]) : NaN),
  });
  chart.append(svg('rect', {className: 'frame', attrs: {x: box.left, y: box.top, width: box.plotWidth, height: box.plotHeight}}));
  const column = model.latestIndexAtOrBefore(first, step);
  charts.stepAxis(chart, box, {
    first: first[0], last: last[count - 1],
    currentX: column >= 0 ? xOf(column + 0.5) : null, currentStep: step,
  });
  const tip = svg('text', {className: 'band-tip', attrs: {x: box.plotRight, y: box.top - 4, 'text-anchor': 'end'}});
  chart.append(tip);
  const columnAt = (event) => {
    const rect = chart.getBoundingClientRect();
    const x = ((event.clientX - rect.left) * box.width) / rect.width;
    return Math.min(count - 1, Math.max(0, Math.floor(((x - box.left) / box.plotWidth) * count)));
  };
  chart.addEventListener('mousemove', (event) => {
    const k = columnAt(event);
    const steps = first[k] === last[k] ? `step ${first[k]}` : `steps ${first[k]}–${last[k]}`;
    const values = low[k] === high[k] ? model.formatNumber(high[k])
      : `${model.formatNumber(low[k])} to ${model.formatNumber(high[k])}`;
    tip.textContent = `${steps}: std ${values}`;
  });
  chart.addEventListener('mouseleave', () => {
    tip.textContent = '';
  });
  if (onStep) chart.addEventListener('click', (event) => onStep(last[columnAt(event)]));
  return chart;
}

function heatmap(series, step) {
  const box = HEATMAP;
  const {left, top} = box;
  const range = model.padToDecades(model.seriesRange(series), series.log.edges);
  const grid = model.distributionOverSteps(series, range);
  const bins = model.magnitudeBins(series.log.edges);
  const cellWidth = box.plotWidth / grid.steps.length;
  const cellHeight = box.plotHeight / grid.rows.length;
  const chart = charts.chartFrame(box, {className: 'heatmap',
    label: `share of elements per magnitude bin over ${grid.steps.length} steps`});

  grid.rows.forEach(({sign}, r) => {
    grid.cells[r].forEach((fraction, c) => {
      if (!(fraction > 0)) return;
      // Log shading: a bin holding 0.1 % should still be visible next to one holding 50 %.
      const intensity = Math.min(1, Math.max(0.12, (Math.log10(fraction) + 5) / 5));
      chart.append(svg('rect', {
        className: `cell ${sign === 0 ? 'zeros' : sign < 0 ? 'negative' : 'positive'}`,
        attrs: {x: round(left + c * cellWidth), y: round(top + r * cellHeight),
          width: round(cellWidth + 0.3), height: round(cellHeight + 0.3), 'fill-opacity': intensity.toFixed(2)},
      }));
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

  chart.append(svg('rect', {className: 'frame', attrs: {x: left, y: top, width: box.plotWidth, height: box.plotHeight}}));
  const column = model.latestIndexAtOrBefore(grid.steps, step);
  charts.stepAxis(chart, box, {
    first: grid.steps[0], last: grid.lastStep,
    currentX: column >= 0 ? left + (column + 0.5) * cellWidth : null, currentStep: grid.steps[column],
  });
  return chart;
}

/** The label of a row whose upper magnitude edge is a decade; '' for the others. */
function heatmapRowLabel(bins, sign, bin) {
  const edge = bins[bin].high;
  if (!Number.isFinite(edge) || !model.isDecade(edge)) return '';
  return `${sign < 0 ? '−' : ''}${model.edgeLabel(edge)}`;
}
