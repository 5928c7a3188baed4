// DOM of the layer view: one panel per tensor, the routing card and
// explanation beside them, the heatmaps below (distribution.js). The weights
// row is in weightsview.js, the layer grid and the run comparison in compare.js.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as model from './model.js';
import {definitionList, html, svg} from './dom.js';

export {overStepsWidth, renderHeatmaps} from './distribution.js';

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
