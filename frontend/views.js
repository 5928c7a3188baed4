// DOM of the GradViz tab's page and of its layer view: one panel per tensor,
// a row per weight under them (weights=True), the routing card and
// explanation beside them, the heatmaps below. The
// layer grid and the run comparison are in compare.js.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {definitionList, html, round, svg, tooltip} from './dom.js';

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
  const flowRunSelect = html('select', {attrs: {name: 'flow-run'}});
  const keepStepButton = html('button', {text: 'Keep this step', attrs: {type: 'button'}});

  const controls = html('header', {className: 'toolbar'}, [
    labelled('Run', runSelect),
    labelled('Layer', layerSelect, 'layer-control'),
    html('div', {className: 'step-control'}, [labelled('Step', stepSlider), stepOutput]),
    labelled('Log count axis', logToggle, 'toggle'),
    reloadButton,
  ]);

  const status = html('p', {className: 'status', attrs: {role: 'status'}});
  const keptSteps = html('ul', {className: 'kept-steps'});
  const flowSummary = html('p', {className: 'flow-summary'});
  const flow = html('div', {className: 'flow-container'});
  const layerTitle = html('h2', {className: 'layer-title'});
  const panels = html('div', {className: 'panels'});
  const weights = html('section', {className: 'weights-section', attrs: {hidden: ''}});
  const routeMap = html('section', {className: 'routemap-container'});
  const aside = html('aside', {className: 'explanation'});
  const heatmaps = html('div', {className: 'heatmaps'});
  const gridTitle = html('h2', {text: 'All layers'});
  const grid = html('div', {className: 'grid-container'});
  const compareCharts = html('div', {className: 'compare-charts'});

  const layerSection = html('section', {className: 'layer-section'}, [
    layerTitle,
    html('div', {className: 'layer-view'}, [
      html('div', {className: 'layer-main'}, [
        panels,
        weights,
        routeMap,
        html('h2', {text: 'Distribution over steps'}),
        html('p', {className: 'hint', text:
          'Each column is one logged step; rows are magnitude bins, positive values above the '
          + 'middle row of exact zeros, negative below. Darker means a larger share of the elements.'}),
        heatmaps,
      ]),
      aside,
    ]),
  ]);

  const page = html('main', {className: 'gradviz'}, [
    controls,
    status,
    html('section', {className: 'flow-section'}, [
      html('h2', {text: 'Gradient flow across layers'}),
      html('p', {className: 'hint', text:
        'Every logged layer in model order, input on the left. Per tensor, on a log axis: the RMS (solid) and '
        + 'the largest magnitude (dashed) of its values; below, the share of exact zeros. One line per step: '
        + 'the slider\'s, and the ones kept. Badges mark the training-health flags (hover for the rule). '
        + 'Click a layer to open it below.'}),
      html('div', {className: 'toolbar'}, [
        labelled('Overlay run', flowRunSelect),
        keepStepButton,
        keptSteps,
      ]),
      flowSummary,
      flow,
    ]),
    layerSection,
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
    compareTensorSelect, compareRunSelect, flowRunSelect, keepStepButton,
    status, keptSteps, flowSummary, flow, layerSection, layerTitle, panels, weights, routeMap, aside, heatmaps, gridTitle, grid,
    compareCharts,
  };
}

/**
 * Replaces a select's options, keeping `selected` when it is still offered.
 * Consecutive options with the same `group` go into one <optgroup>.
 */
export function setOptions(select, options, selected) {
  const nodes = [];
  let group = null;
  for (const {value, label, group: name} of options) {
    const option = html('option', {text: label ?? value});
    option.value = value;
    if (!name) {
      group = null;
      nodes.push(option);
      continue;
    }
    if (group?.label !== name) nodes.push((group = html('optgroup', {attrs: {label: name}})));
    group.append(option);
  }
  select.replaceChildren(...nodes);
  if (options.some((option) => option.value === selected)) select.value = selected;
  select.disabled = options.length === 0;
}

export function showStatus(status, message, isError = false) {
  status.textContent = message;
  status.classList.toggle('error', isError);
  status.hidden = !message;
}

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
}

function tensorPanel(layer, info, series, snapshot, logarithmic) {
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

// ------------------------------------------------------------ weights

/**
 * The weights of a layer logged with `weights=True`, under its tensors: per
 * weight a row of its values, its gradient (panels as the layer's tensors
 * have) and its update ratio over steps. Hidden and empty for a layer
 * without weights.
 *
 * @param {object[]} weights per weight `{weight, values, gradient, updates, hasUpdates}`:
 *   `values` and `gradient` as `{info, series}` (null where not logged), `updates` its
 *   /updates entry (null: none), `hasUpdates` whether /runs lists update records for it.
 * @param {{step: number, logarithmic: boolean}} options
 */
export function renderWeights(container, layer, weights, {step, logarithmic}) {
  container.hidden = weights.length === 0;
  if (weights.length === 0) {
    container.replaceChildren();
    return;
  }
  container.replaceChildren(
    html('h2', {text: 'Weights'}),
    html('p', {className: 'hint', text: `${captions.WEIGHTS_NOTE} ${captions.UPDATE_RATIO_NOTE}`}),
    ...weights.map((entry) => html('section', {className: 'weight-row', attrs: {'data-weight': entry.weight}}, [
      html('div', {className: 'panels'}, [
        ...[entry.values, entry.gradient].filter(Boolean).map(({info, series}) =>
          tensorPanel(layer, info, series, series && model.snapshotAt(series, step), logarithmic)),
        updatePanel(entry, step),
      ]),
    ])),
  );
}

/** A weight's update at the slider's step, and its update ratio over all steps. */
function updatePanel({weight, updates, hasUpdates}, step) {
  const title = `Update ratio of ${weight}`;
  const panel = html('article', {className: 'panel update-panel', attrs: {'data-weight': weight, 'aria-label': title}}, [
    html('header', {}, [
      html('h3', {text: title}),
      html('p', {className: 'produced-by', text: '|w − w_previous| / |w| between two log events'}),
    ]),
  ]);
  const update = model.updateAt(updates, step);
  if (update) {
    const summary = captions.updateSummary(update);
    Object.assign(panel.dataset, {step: update.step, updateRatio: update.update_ratio,
      weightNorm: update.weight_norm, updateNorm: update.update_norm, interval: update.interval});
    panel.append(
      html('p', {className: 'update-headline'}, [
        html('strong', {className: 'update-ratio', text: summary.ratio}),
        html('span', {className: `update-size size-${update.size ?? 'none'}`,
          text: summary.size && ` ${summary.size}`}),
      ]),
      html('p', {className: 'update-detail', text: `${summary.title}: ${summary.detail}`}),
    );
  } else {
    panel.append(html('p', {className: 'empty', text: captions.noUpdateText(hasUpdates)}));
  }
  if (updates) panel.append(updateChart(updates, update?.step ?? null));
  return panel;
}

const UPDATE_CHART = charts.chartBox({width: 420, height: 170, left: 46, right: 10, top: 10, bottom: 30});
const UPDATE_ZERO_ROW = 12;

/** The update ratio of one weight over steps, on a log axis with the healthy ~1e-3 as a guide. */
function updateChart(entry, currentStep) {
  const values = entry.update_ratio;
  const zeros = flowmodel.hasZero([values]);
  // Exact zeros (a weight that did not move) sit on a row of their own under the log axis.
  const box = zeros ? {...UPDATE_CHART, plotHeight: UPDATE_CHART.plotHeight - UPDATE_ZERO_ROW,
    baseline: UPDATE_CHART.baseline - UPDATE_ZERO_ROW} : UPDATE_CHART;
  const range = flowmodel.updateRatioRange([values]);
  const first = entry.steps[0];
  const last = entry.steps[entry.steps.length - 1];
  const xOf = (s) => box.left + (last > first ? (s - first) / (last - first) : 0.5) * box.plotWidth;
  const yOf = (value) => (value === 0 ? UPDATE_CHART.baseline
    : box.baseline - flowmodel.logPosition(value, range) * box.plotHeight);
  const chart = charts.chartFrame(UPDATE_CHART, {className: 'update-chart',
    label: `update ratio of ${entry.weight} over ${entry.steps.length} steps, log axis`});
  chart.dataset.logLow = range.low;
  chart.dataset.logHigh = range.high;
  charts.valueAxis(chart, box, {ticks: flowmodel.decadeTicks(range, 5).map((e) => 10 ** e), max: 10 ** range.high,
    yOf, label: model.edgeLabel});
  if (zeros) {
    chart.append(svg('text', {className: 'tick', text: '0', attrs: {x: box.left - 4, y: UPDATE_CHART.baseline + 3, 'text-anchor': 'end'}}));
  }
  charts.guideLine(chart, box, {y: yOf(model.UPDATE_RATIO_GUIDE), label: '10⁻³: usual size', title: captions.UPDATE_RATIO_NOTE});
  for (const run of flowmodel.drawableRuns(values, flowmodel.drawableOnLogPanel)) {
    if (run.length > 1) {
      const d = run.map((k, n) => `${n ? 'L' : 'M'}${round(xOf(entry.steps[k]))},${round(yOf(values[k]))}`).join('');
      chart.append(svg('path', {className: 'line update-line', attrs: {d}}));
    }
    for (const k of run) {
      chart.append(svg('circle', {className: 'dot update-dot', attrs: {
        cx: round(xOf(entry.steps[k])), cy: round(yOf(values[k])), r: 2.4,
        'data-step': entry.steps[k], 'data-value': String(values[k]),
      }}, [tooltip(`step ${entry.steps[k]}: ${model.formatNumber(values[k])}`
        + ` (|Δw| ${model.formatNumber(entry.update_norm[k])} over ${entry.interval[k]} steps)`)]));
    }
  }
  charts.stepAxis(chart, UPDATE_CHART, {first, last,
    currentX: currentStep === null ? null : xOf(currentStep), currentStep});
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

/** One heatmap per tensor of the layer: magnitude bins (rows) over steps (columns). */
export function renderHeatmaps(container, layer, tensors, step) {
  container.replaceChildren(...tensors.map(({info, series}) => html('figure', {
    className: `heatmap-figure role-${info.role}`, attrs: {'data-tensor': info.tensor},
  }, [
    html('figcaption', {text: captions.tensorTitle(info, layer.tensors)}),
    series ? heatmap(series, step) : html('p', {className: 'empty', text: 'no data'}),
  ])));
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
    first: grid.steps[0], last: grid.steps[grid.steps.length - 1],
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
