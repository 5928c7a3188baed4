// Data for the GradViz tab: the routes of docs/API.md (fetched by api.js) and
// their answers shaped for drawing. No DOM here, so all of it runs under `node --test`.

import {fetchJson} from './api.js';

// The numbers' formatting and the axes' ticks, which every view reads as `model.*`.
export {
  binRangeLabel, countScale, edgeLabel, formatCompactCount, formatCount, formatNumber, formatPercent,
  formatShape, isDecade, linearTicks, logTicks, spacedLabels,
} from './format.js';
// The magnitude bins, read as `model.*` too.
export {magnitudeBins, occupiedRange, padToDecades, seriesRange, signedBars} from './bins.js';

export const ROLES = ['activation', 'input_gradient', 'output_gradient'];

/** The roles of a weight's two tensors, logged with `weights=True`. */
export const WEIGHT_ROLES = ['weight', 'weight_gradient'];

/**
 * The size of a weight's update |w - w_previous| / |w| practitioners call
 * healthy, and the sizes past which it jumps or barely moves.
 */
export const UPDATE_RATIO_GUIDE = 1e-3;

// `size` is the server's verdict on the ratio per step (tb_gradviz/health.py, `update_size`).
export const UPDATE_FIELDS = ['weight_norm', 'update_norm', 'update_ratio', 'interval', 'size'];

export const STATS_FIELDS = [
  'count', 'zeros', 'nan', 'pos_inf', 'neg_inf', 'min', 'max', 'mean', 'std', 'sum',
];

// The routes' answers: fetched and parsed (api.js), read as `model.*` too.
export {
  ApiError, fetchJson, fetchRouting, fetchRuns, fetchSeries, fetchStep, fetchUpdates, parseApiJson, reviveNonFinite,
  routeUrl,
} from './api.js';

// ------------------------------------------------------------ runs, layers

/**
 * Keeps the runs TensorBoard's host page knows of (its run list), in the
 * order of `/runs`. `hostRuns` is null outside TensorBoard: then all runs.
 */
export function visibleRuns(runs, hostRuns) {
  if (!hostRuns) return runs;
  const known = new Set(hostRuns);
  return runs.filter((run) => known.has(run.run));
}

/**
 * A layer's tensors grouped by the role /runs serves for each, every group in
 * the order of /runs. Tensors of a role the tab does not know are left out.
 *
 * @param {{tensor: string, role: string}[]} tensors
 */
export function tensorsByRole(tensors) {
  const groups = Object.fromEntries(ROLES.map((role) => [role, []]));
  for (const info of tensors) if (Object.hasOwn(groups, info.role)) groups[info.role].push(info);
  return groups;
}

/** A layer's own tensors (its output and the gradients around it), in the order of /runs; weight tensors left out. */
export function layerTensors(tensors) {
  return tensors.filter(({role}) => ROLES.includes(role));
}

/**
 * A layer's weights, in the order /runs lists them: per weight its values
 * and its gradient (their /runs tensor entries, null where not logged) and
 * whether it has update records. Empty for a layer without trainable
 * weights and for a run logged without `weights=True`.
 */
export function layerWeights(layer) {
  const updates = new Set(layer.updates ?? []);
  const tensorOf = (role, weight) => layer.tensors.find((info) => info.role === role && info.weight === weight) ?? null;
  return (layer.weights ?? []).map((weight) => ({
    weight,
    values: tensorOf('weight', weight),
    gradient: tensorOf('weight_gradient', weight),
    updates: updates.has(weight),
  }));
}

/** The tensors the run comparison offers: the layer's own, then its weights' (`group` 'Weights'). */
export function comparableTensors(tensors) {
  return [
    ...layerTensors(tensors).map(({tensor}) => ({value: tensor})),
    ...tensors.filter(({role}) => WEIGHT_ROLES.includes(role)).map(({tensor}) => ({value: tensor, group: 'Weights'})),
  ];
}

/** The union of several step lists, sorted. */
export function unionSteps(stepLists) {
  return [...new Set(stepLists.flat())].sort((a, b) => a - b);
}

/**
 * The layer view's line on the steps with full records: those of its series (`steps`, sorted),
 * where the slider stops. The callback may keep them at some logged steps only (its
 * `full_records=`); every logged step has the digest, which the flags and "Over time" read.
 */
export function fullRecordsLine(steps) {
  if (steps.length === 0) return '';
  const count = steps.length === 1 ? '1 step' : `${steps.length} steps, ${steps[0]} to ${steps[steps.length - 1]}`;
  return `Full records (histograms, stats) at ${count}: the slider stops at each. A logged step `
    + 'without them has the digest only, which the flags and "Over time" read.';
}

/** The index of the latest step `<= step` in a sorted list, or -1 if there is none. */
export function latestIndexAtOrBefore(steps, step) {
  let low = 0;
  let high = steps.length - 1;
  let found = -1;
  while (low <= high) {
    const middle = (low + high) >> 1;
    if (steps[middle] <= step) {
      found = middle;
      low = middle + 1;
    } else {
      high = middle - 1;
    }
  }
  return found;
}

// ------------------------------------------------------------ series shaping

// The one-step /series bodies of a downsampled series, by step: fetched as
// the step is shown (loadRecord), a promise while on the way.
const RECORDS = new WeakMap();

/**
 * One step of a `/series` answer: the stats as an object of numbers, the
 * magnitude bins and the linear histogram (null when not held). Null when the
 * series has no step `<= step`; `{step, pending: true}` when the series is
 * downsampled and that step's record is not loaded yet (`loadRecord`).
 */
export function snapshotAt(series, step) {
  const index = latestIndexAtOrBefore(series.steps, step);
  if (index < 0) return null;
  if (series.downsampled) {
    const record = RECORDS.get(series)?.get(series.steps[index]);
    return record && !(record instanceof Promise) ? snapshotAt(record, step) : {step: series.steps[index], pending: true};
  }
  const stats = {};
  for (const field of STATS_FIELDS) stats[field] = series.stats[field][index];
  const counts = series.histogram?.counts?.[index] ?? null;
  return {
    step: series.steps[index],
    stats,
    negative: series.log.negative[index],
    positive: series.log.positive[index],
    histogram: counts && {low: series.histogram.low[index], high: series.histogram.high[index], counts},
  };
}

/**
 * Fetches the record of a downsampled series at the latest step `<= step`
 * (`/series?step=`), once per step, for `snapshotAt`. Resolves to null for a
 * series sent whole or with no such step.
 */
export function loadRecord(series, step, fetchImpl) {
  const index = latestIndexAtOrBefore(series.steps, step);
  if (!series.downsampled || index < 0) return Promise.resolve(null);
  const at = series.steps[index];
  if (!RECORDS.has(series)) RECORDS.set(series, new Map());
  const records = RECORDS.get(series);
  if (!records.has(at)) {
    const {run, layer, tensor} = series;
    records.set(at, fetchJson('series', {run, layer, tensor, step: at}, fetchImpl).then((record) => {
      records.set(at, record);
      return record;
    }, (error) => {
      records.delete(at);
      throw error;
    }));
  }
  return Promise.resolve(records.get(at));
}

/**
 * A stats field over steps, column by column: each step its own column, or
 * the server's columns of a downsampled series. `low` and `high` are each
 * column's smallest and largest value (equal for a single step).
 *
 * @returns {{first: number[], last: number[], low: number[], high: number[]}}
 */
export function fieldOverSteps(series, field) {
  if (series.downsampled) {
    const {first_step: first, last_step: last} = series.columns;
    return {first, last, low: series.stats[field].min, high: series.stats[field].max};
  }
  return {first: series.steps, last: series.steps, low: series.stats[field], high: series.stats[field]};
}

/**
 * Groups `values` (one per step) into at most `count` columns of consecutive
 * steps in equal numbers, as the server groups a downsampled series, and
 * keeps each column's smallest and largest value among those `keep` takes
 * (NaN where it takes none).
 *
 * @returns {{starts: number[], low: number[], high: number[]}} `starts[k]`: the index of column k's first step.
 */
export function columnExtremes(values, count, keep = Number.isFinite) {
  const n = values.length;
  const columns = Math.min(n, count);
  const starts = Array.from({length: columns}, (_, k) => Math.floor((k * n) / columns));
  const low = [];
  const high = [];
  starts.forEach((start, k) => {
    let smallest = Infinity;
    let largest = -Infinity;
    for (let i = start; i < (starts[k + 1] ?? n); i++) {
      if (!keep(values[i])) continue;
      if (values[i] < smallest) smallest = values[i];
      if (values[i] > largest) largest = values[i];
    }
    low.push(smallest <= largest ? smallest : NaN);
    high.push(smallest <= largest ? largest : NaN);
  });
  return {starts, low, high};
}

/** The routing record of the latest step `<= step`, as an object, or null. */
export function routingAt(routing, step) {
  const index = latestIndexAtOrBefore(routing.steps, step);
  if (index < 0) return null;
  const fields = [
    'input_positions', 'routed_positions', 'windows', 'tied_windows',
    'input_gradient_sum', 'output_gradient_sum', 'output_gradient_abs_sum',
  ];
  // The server's verdict on mass conservation (docs/API.md), never judged again here.
  const mass = Object.fromEntries(Object.entries(routing.mass).map(([key, values]) => [key, values[index]]));
  return Object.fromEntries([['step', routing.steps[index]], ...fields.map((f) => [f, routing[f][index]]), ['mass', mass]]);
}

/** One weight's entry of an /updates answer, or null when it has no update records. */
export function weightUpdates(updates, weight) {
  return updates?.weights.find((entry) => entry.weight === weight) ?? null;
}

/** The update record of one weight (an /updates entry) at the latest step `<= step`, as an object, or null. */
export function updateAt(entry, step) {
  const index = entry ? latestIndexAtOrBefore(entry.steps, step) : -1;
  if (index < 0) return null;
  return Object.fromEntries([['step', entry.steps[index]], ...UPDATE_FIELDS.map((field) => [field, entry[field][index]])]);
}

// ------------------------------------------------------------ statistics

export function zeroFraction(stats) {
  return stats.count > 0 ? stats.zeros / stats.count : NaN;
}

export function nonFiniteCount(stats) {
  return stats.nan + stats.pos_inf + stats.neg_inf;
}

/**
 * What the window geometry predicts for a max pool: one routed position per
 * window at most. NaN for average pooling, which gives every position inside
 * a window a share.
 */
export function predictedRoutedFraction(routing, pooling) {
  if (pooling?.type !== 'max' || !(routing.input_positions > 0)) return NaN;
  return routing.windows / routing.input_positions;
}

/** Whether a pooling layer's windows overlap (stride smaller than the window). */
export function windowsOverlap(pooling) {
  if (!pooling || pooling.global || !pooling.pool_size || !pooling.strides) return false;
  return pooling.pool_size.some((size, axis) => pooling.strides[axis] < size);
}

export function routedFraction(routing) {
  return routing.input_positions > 0 ? routing.routed_positions / routing.input_positions : NaN;
}

// ------------------------------------------------------------ distribution over steps

/**
 * The distribution of each step as fractions of all elements, for a heatmap:
 * rows top to bottom are positive bins by falling magnitude, the zeros, then
 * negative bins by rising magnitude, so that 0 sits in the middle.
 *
 * @returns {{steps: number[], lastSteps: number[], lastStep: number, rows: {sign: number, bin: number}[],
 *   cells: number[][]}} `cells[row][column]`; `sign` 0 is the zero row.
 */
export function distributionOverSteps(series, range, maxColumns = 200) {
  // Consecutive steps (or the server's columns of them) share a column in
  // equal numbers; a cell is the largest share among its steps, so that a bin
  // filled at one step of thousands shows. A server column's largest bin count
  // over its smallest count bounds the largest share of its steps.
  const {first, last} = fieldOverSteps(series, 'count');
  const counts = series.downsampled ? series.stats.count.min : series.stats.count;
  const zeros = series.downsampled ? series.stats.zeros.max : series.stats.zeros;
  const n = first.length;
  const count = Math.min(n, maxColumns);
  const starts = Array.from({length: count}, (_, k) => Math.floor((k * n) / count));
  const rows = [];
  if (range) for (let j = range.last; j >= range.first; j--) rows.push({sign: 1, bin: j});
  rows.push({sign: 0, bin: -1});
  if (range) for (let j = range.first; j <= range.last; j++) rows.push({sign: -1, bin: j});
  const share = (sign, bin, i) => {
    const total = counts[i];
    if (!(total > 0)) return 0;
    if (sign === 0) return zeros[i] / total;
    return (sign > 0 ? series.log.positive[i] : series.log.negative[i])[bin] / total;
  };
  const cells = rows.map(({sign, bin}) => starts.map((start, k) => {
    let largest = 0;
    for (let i = start; i < (starts[k + 1] ?? n); i++) largest = Math.max(largest, share(sign, bin, i));
    return largest;
  }));
  // Each column by its first and last step (the slider's step falls in the first's), and the
  // last step drawn.
  const lastSteps = starts.map((_, k) => last[(starts[k + 1] ?? n) - 1]);
  return {steps: starts.map((i) => first[i]), lastSteps, lastStep: last[n - 1], rows, cells};
}

/** At most `max` indices of `0..n-1`, evenly spread, first and last included. */
export function evenlySpacedIndices(n, max) {
  if (n <= max) return Array.from({length: n}, (_, i) => i);
  if (max <= 1) return [n - 1];
  const indices = new Set();
  for (let k = 0; k < max; k++) indices.add(Math.round((k * (n - 1)) / (max - 1)));
  return [...indices];
}
