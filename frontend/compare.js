// DOM of the two comparisons: every layer of a run at one step (the /step
// grid, with its training-health flags), and one tensor of a layer in two runs.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as model from './model.js';
import {html, round, svg, tooltip} from './dom.js';

// ------------------------------------------------------------ compare layers

const SPARKLINE = charts.chartBox({width: 120, height: 26, left: 0, right: 0, top: 2, bottom: 0});
const SPARKLINE_ZERO_GAP = 4;

/**
 * All layers of a run at one step (the `/step` answer) as a table: zero
 * fraction and a magnitude sparkline per tensor, routing for pooling layers,
 * and each layer's update ratio when the run logged weights (weight tensors
 * themselves are left to the layer view). `layerOf(layer)` gives a layer's entry in /runs, whose tensors carry their
 * roles; `onSelect(layer)` is called when a layer name is activated.
 */
export function renderLayerGrid(container, title, snapshot, {currentLayer, layerOf, onSelect}) {
  title.textContent = `All layers of ${snapshot.run} at step ${snapshot.step}`;
  const rows = snapshot.layers.map((layer) => {
    const info = layerOf(layer.layer);
    const logged = (info?.tensors ?? []).filter(({tensor}) => Object.hasOwn(layer.tensors, tensor));
    return {layer, info, groups: model.tensorsByRole(logged)};
  });
  // One axis per column: activations and gradients live decades apart.
  const ranges = Object.fromEntries(model.ROLES.map((role) => {
    const binLists = rows.flatMap(({layer, groups}) => groups[role].flatMap(({tensor}) =>
      [layer.tensors[tensor].log.negative, layer.tensors[tensor].log.positive]));
    return [role, model.padToDecades(model.occupiedRange(binLists), snapshot.log_edges)];
  }));
  const updates = rows.some(({info}) => (info?.updates ?? []).length > 0);

  const head = html('thead', {}, [html('tr', {}, [
    html('th', {text: 'Layer', attrs: {scope: 'col'}}),
    html('th', {text: 'Class', attrs: {scope: 'col'}}),
    html('th', {text: 'Step', attrs: {scope: 'col'}}),
    html('th', {text: 'Flags', attrs: {scope: 'col'}}),
    ...model.ROLES.map((role) => html('th', {text: captions.ROLE_TITLES[role], attrs: {scope: 'col'}})),
    html('th', {text: 'Routed (predicted)', attrs: {scope: 'col'}}),
    updates && html('th', {text: 'Update ratio', attrs: {scope: 'col', title: captions.UPDATE_RATIO_NOTE}}),
  ])]);
  const body = html('tbody', {}, rows.map(({layer, info, groups}) => {
    const button = html('button', {className: 'link', text: layer.layer, attrs: {type: 'button'}});
    button.addEventListener('click', () => onSelect(layer.layer));
    const row = html('tr', {className: layer.layer === currentLayer ? 'current' : undefined}, [
      html('th', {attrs: {scope: 'row'}}, [button]),
      html('td', {text: layer.layer_class ?? ''}),
      html('td', {className: 'number', text: String(layer.step)}),
      html('td', {className: 'flags'}, flagBadges(layer.flags ?? [], snapshot.health?.rules)),
      ...model.ROLES.map((role) => html('td', {className: 'tensor-cell'}, groups[role].map((tensor) =>
        gridTensor(tensor, groups[role].length > 1, layer.tensors[tensor.tensor], snapshot.log_edges, ranges[role])))),
      html('td', {className: 'number', text: captions.routingCell(layer.routing, info?.pooling ?? null)}),
      updates && updateCell(layer),
    ]);
    if (layer.layer === currentLayer) row.setAttribute('aria-current', 'true');
    return row;
  }));
  container.replaceChildren(html('table', {className: 'layer-grid'}, [head, body]));
}

/** A layer's update ratio at the step (its weights as one vector), '' without weights or update yet. */
function updateCell(layer) {
  const ratio = layer.update_ratio ?? null;
  const size = layer.update_size ?? null;
  return html('td', {
    className: `number update-cell${size ? ` size-${size}` : ''}`,
    text: ratio === null ? '' : model.formatNumber(ratio),
    attrs: ratio === null ? {} : {title: captions.updateSize(size), 'data-value': String(ratio)},
  });
}

/** A badge per raised flag; its hover text is the flag's rule as /step serves it, and its detail. */
export function flagBadges(flags, rules) {
  return flags.map((flag) => html('span', {
    className: `flag-badge flag-${flag.flag}`, text: captions.FLAG_TITLES[flag.flag] ?? flag.flag,
    attrs: {title: captions.flagTitle(flag, rules), 'data-flag': flag.flag},
  }));
}

/** One tensor in the grid; the index of /runs tells apart several of one role. */
function gridTensor(info, several, tensor, edges, range) {
  const label = several ? `${info.index}: ` : '';
  return html('div', {className: 'grid-tensor', attrs: {'data-tensor': info.tensor}}, [
    html('span', {className: 'grid-zeros', text: `${label}${model.formatPercent(model.zeroFraction(tensor.stats))} zeros`}),
    sparkline(tensor.log.negative, tensor.log.positive, edges, range),
  ]);
}

function sparkline(negative, positive, edges, range) {
  const box = SPARKLINE;
  const chart = charts.chartFrame(box, {className: 'sparkline', label: null});
  chart.setAttribute('width', box.width);
  chart.setAttribute('height', box.height);
  if (!range) return chart;
  const bars = model.signedBars(negative, positive, range);
  const max = Math.max(1, ...bars.map((bar) => bar.count));
  const bins = model.magnitudeBins(edges);
  charts.drawSignedBars(chart, box, charts.signedSlots(box, bars.length, SPARKLINE_ZERO_GAP), bars, {
    heightOf: ({count}) => Math.max(1, box.plotHeight * (count / max)),
    title: ({sign, bin, count}) => `${model.binRangeLabel(bins, sign, bin)}: ${model.formatCount(count)}`,
    spacing: 0.3,
  });
  return chart;
}

// ------------------------------------------------------------ compare runs

const LINES = charts.chartBox({width: 460, height: 190, left: 46, right: 12, top: 10, bottom: 34});
const OVERLAY_ZERO_GAP = 14;

/**
 * The same tensor of one layer in two runs: the zero fraction over steps and
 * the magnitude histograms at the chosen step, as shares of all elements.
 *
 * @param {{run: string, series: object}[]} entries one or two runs.
 * @returns {Promise} resolves once the charts show the records at `step`
 */
export function renderRunComparison(container, entries, step) {
  if (entries.length === 0) {
    container.replaceChildren(html('p', {className: 'empty', text: 'No tensor to compare.'}));
    return Promise.resolve();
  }
  container.dataset.step = step;
  const pending = entries.filter(({series}) => model.snapshotAt(series, step)?.pending);
  // Downsampled series: their records at this step are fetched, then the charts drawn again.
  const drawing = pending.length === 0 ? Promise.resolve()
    : Promise.all(pending.map(({series}) => model.loadRecord(series, step))).then(() => {
      if (container.isConnected && container.dataset.step === String(step)) renderRunComparison(container, entries, step);
    }, () => {});
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
  return drawing;
}

function zeroFractionChart(entries, step) {
  const box = LINES;
  const steps = model.unionSteps(entries.map(({series}) => series.steps));
  const {first, last, xOf} = charts.stepScale(box, steps);
  const yOf = (fraction) => box.top + box.plotHeight * (1 - fraction);
  const chart = charts.chartFrame(box, {className: 'lines', label: 'share of exact zeros over steps'});
  charts.shareAxis(chart, box, {ticks: [0, 0.25, 0.5, 0.75, 1], yOf});
  entries.forEach(({run, series}, i) => {
    if (series.downsampled) {
      // Each server column from its smallest to its largest share of zeros.
      const zeros = model.fieldOverSteps(series, 'zeros');
      const count = model.fieldOverSteps(series, 'count');
      const columns = zeros.first.length;
      charts.drawBand(chart, {
        count: columns, className: `band series-${i}`,
        xOf: (k) => xOf(k < columns ? zeros.first[k] : zeros.last[columns - 1]),
        lowY: (k) => yOf(zeros.low[k] / count.high[k]),
        highY: (k) => yOf(zeros.high[k] / count.low[k]),
      });
      return;
    }
    const points = series.steps.map((s, k) => [xOf(s), yOf(series.stats.zeros[k] / series.stats.count[k])])
      .filter(([, y]) => Number.isFinite(y));
    if (points.length === 0) return;
    const path = points.map(([x, y], k) => `${k ? 'L' : 'M'}${round(x)},${round(y)}`).join('');
    chart.append(svg('path', {className: `line series-${i}`, attrs: {d: path}}, [tooltip(run)]));
    if (points.length <= 60) {
      for (const [x, y] of points) chart.append(svg('circle', {className: `dot series-${i}`, attrs: {cx: round(x), cy: round(y), r: 2.2}}));
    }
  });
  // A step outside this tensor's steps is marked at the nearer end.
  charts.stepAxis(chart, box, {first, last, currentX: xOf(Math.min(Math.max(step, first), last)), currentStep: step});
  return chart;
}

function overlayHistogram(entries, step) {
  const box = LINES;
  const snapshots = entries.map(({series}) => model.snapshotAt(series, step))
    .map((snapshot) => (snapshot?.pending ? null : snapshot));
  const edges = entries[0].series.log.edges;
  const range = model.padToDecades(model.occupiedRange(
    snapshots.filter(Boolean).flatMap((s) => [s.negative, s.positive])), edges);
  const chart = charts.chartFrame(box, {className: 'histogram overlay', label: 'magnitude histograms of both runs'});
  if (!range) {
    charts.emptyMessage(chart, box, 'no non-zero values at this step');
    return chart;
  }
  const bins = model.magnitudeBins(edges);
  const shares = snapshots.map((s) => s && model.signedBars(s.negative, s.positive, range)
    .map((bar) => ({...bar, share: s.stats.count > 0 ? bar.count / s.stats.count : 0})));
  const maxShare = Math.max(1e-9, ...shares.flat().filter(Boolean).map((bar) => bar.share));
  charts.valueAxis(chart, box, {
    ticks: model.linearTicks(maxShare, 3), max: maxShare,
    yOf: (tick) => box.top + box.plotHeight * (1 - tick / maxShare),
    label: (tick) => model.formatPercent(tick, tick < 0.01 ? 2 : 1),
  });
  const slots = charts.signedSlots(box, shares.find(Boolean).length, OVERLAY_ZERO_GAP);
  shares.forEach((bars, s) => {
    if (!bars) return;
    charts.drawSignedBars(chart, box, slots, bars, {
      heightOf: ({share}) => box.plotHeight * (share / maxShare),
      title: ({sign, bin, share}) => `${entries[s].run}: ${model.binRangeLabel(bins, sign, bin)}: ${model.formatPercent(share, 2)}`,
      className: () => `series-${s}`, series: s, seriesCount: entries.length, spacing: 0.4,
    });
  });
  charts.magnitudeAxis(chart, box, slots, bins, range);
  return chart;
}
