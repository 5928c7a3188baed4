// DOM of a layer's weights (weights=True), under its tensors: per weight a
// row of its values, its gradient and its update ratio over steps.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {html, round, svg, tooltip} from './dom.js';
import {panelsDrawn, tensorPanel} from './views.js';

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
    return Promise.resolve();
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
  return panelsDrawn(container);
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
  const {first, last, xOf} = charts.stepScale(box, entry.steps);
  const yOf = charts.logScale(range, {bottom: box.baseline, height: box.plotHeight, zeroY: UPDATE_CHART.baseline});
  const chart = charts.chartFrame(UPDATE_CHART, {className: 'update-chart',
    label: `update ratio of ${entry.weight} over ${entry.steps.length} steps, log axis`});
  chart.dataset.logLow = range.low;
  chart.dataset.logHigh = range.high;
  charts.logAxis(chart, box, {range, yOf, zeroY: UPDATE_CHART.baseline, zeros, maxTicks: 5});
  charts.updateRatioGuide(chart, box, yOf);
  chart.dataset.steps = entry.steps.length;
  if (entry.steps.length > box.plotWidth) {
    // More steps than units of width: a band from each column's smallest to its largest
    // non-zero ratio, one path, so that one step's jump stays visible.
    const {starts, low, high} = model.columnExtremes(values, Math.floor(box.plotWidth),
      (value) => value > 0 && Number.isFinite(value));
    chart.dataset.columns = starts.length;
    charts.drawBand(chart, {
      count: starts.length, className: 'band update-band',
      xOf: (k) => xOf(entry.steps[k < starts.length ? starts[k] : entry.steps.length - 1]),
      lowY: (k) => yOf(low[k]), highY: (k) => yOf(high[k]),
    });
    charts.stepAxis(chart, UPDATE_CHART, {first, last,
      currentX: currentStep === null ? null : xOf(currentStep), currentStep});
    return chart;
  }
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
