// The depth x time view's data: fetching /timeline, the colour scale, the
// cell under the pointer and the difference of two runs. No DOM: runs under node.

import {fetchJson} from './model.js';

export const FIELDS = ['rms', 'max_abs', 'zero_share', 'update_ratio', 'flush_share', 'block_zero_share'];
export const FIELD_TITLES = {
  rms: 'log10 RMS',
  max_abs: 'log10 max |x|',
  zero_share: 'share of exact zeros',
  update_ratio: 'log10 update ratio',
  flush_share: 'share that flushes to zero',
  block_zero_share: 'share that becomes zero in MXFP8 E4M3',
};
// The flags the view marks, in the order of their lanes in a row (every flag of /step).
export const FLAGS = ['nonfinite', 'exploding', 'vanishing', 'dead', 'underflow', 'overflow'];
// Fields shown on a log scale; the zero, flush and block shares are plain fractions.
export const LOG_FIELDS = new Set(['rms', 'max_abs', 'update_ratio']);

/** Requested widths are multiples of this many columns (below it, the drawing's own width). */
export const WIDTH_STEP = 50;

/**
 * How many columns to ask /timeline for to draw `pixels` CSS pixels: the largest multiple of
 * `WIDTH_STEP` not above them, so never more columns than pixels, and a layout that moves by a
 * few pixels asks for the body the server already built. 0 when there is nothing to draw.
 */
export function columnsFor(pixels) {
  const width = Math.floor(pixels);
  if (!(width > 0)) return 0;
  return width < WIDTH_STEP ? width : Math.floor(width / WIDTH_STEP) * WIDTH_STEP;
}

/**
 * Fetches /timeline: every layer of a run over its logged steps (those from `range.start` to
 * `range.end` when a range is given), at most `width` columns (about one per pixel of the drawing).
 */
export async function fetchTimeline(run, {field = 'rms', role = 'output_gradient', width, range = null}, fetchImpl) {
  const params = {run, field, role, width: Math.max(1, Math.min(10000, Math.round(width)))};
  if (range) Object.assign(params, {start: range.start, end: range.end});
  return fetchJson('timeline', params, fetchImpl);
}

/** A cell's shown value: the column's largest (a spike is what the envelope keeps), on the field's scale. */
export function shownValue(field, envelope, column) {
  const value = envelope.max[column];
  if (value === null || value === undefined || !Number.isFinite(value)) return null;
  if (!LOG_FIELDS.has(field)) return value;
  return value > 0 ? Math.log10(value) : null;
}

/**
 * Whether column `c` of a log field's `envelope` holds a value that is not finite, rather than
 * none: /timeline writes both as NaN, and a NaN there is the tensor's own where the column
 * raises `nonfinite` (a NaN or an Inf in the tensor makes its RMS and max |x| NaN or Inf).
 */
export function notFiniteAt(field, envelope, flags, c) {
  if (!LOG_FIELDS.has(field)) return false;
  const values = [envelope.min[c], envelope.max[c]];
  if (values.some((value) => value === Infinity || value === -Infinity)) return true;
  return values.some(Number.isNaN) && flags.includes('nonfinite');
}

/**
 * The matrix the view draws: `{rows: [{layer, values, flags, notFinite}], columns, low, high,
 * diverging}`, `values[c]` on the field's scale (null where there is none), `flags[c]` the flags
 * raised in column `c`, `notFinite[c]` whether its value is there but not finite
 * (`notFiniteAt`). `low`/`high` span the finite values (the colour scale's ends).
 */
export function timelineMatrix(body) {
  const columns = body.columns.first_step.length;
  // `FLAGS` first, then any other flag the server judges, in its order.
  const named = new Set(FLAGS);
  for (const layer of body.layers) for (const flag of Object.keys(layer.flags)) named.add(flag);
  const rows = body.layers.map((layer) => {
    const envelope = layer[body.field];
    const values = Array.from({length: columns}, (_, c) => shownValue(body.field, envelope, c));
    const flags = Array.from({length: columns}, () => []);
    for (const flag of named) {
      for (const c of layer.flags[flag] ?? []) flags[c].push(flag);
    }
    const notFinite = values.map((value, c) => value === null && notFiniteAt(body.field, envelope, flags[c], c));
    // `format`: what a flush share is taken in (float16, or the format the layer computes in),
    // or a block share (mxfp8_e4m3).
    return {layer: layer.layer, values, flags, notFinite, envelope, ...(layer.format && {format: layer.format})};
  });
  return withRange({rows, columns: body.columns, field: body.field, diverging: false, flags: [...named]});
}

function withRange(matrix) {
  let low = Infinity;
  let high = -Infinity;
  for (const row of matrix.rows) {
    for (const value of row.values) {
      if (value === null) continue;
      if (value < low) low = value;
      if (value > high) high = value;
    }
  }
  if (low > high) [low, high] = [0, 1];
  if (matrix.diverging) {
    const reach = Math.max(Math.abs(low), Math.abs(high), 1e-12);
    [low, high] = [-reach, reach];
  } else if (low === high) {
    [low, high] = [low - 0.5, high + 0.5];
  }
  return {...matrix, low, high};
}

/**
 * Run A minus run B, cell by cell: the layers both have (in A's order), each
 * column of A against the column of B that holds A's column's first step
 * (null where B has none). Log fields differ in decades.
 */
export function differenceMatrix(a, b) {
  const ofB = new Map(b.rows.map((row) => [row.layer, row]));
  const bColumn = a.columns.first_step.map((step) => columnHolding(b.columns, step));
  const rows = a.rows.filter((row) => ofB.has(row.layer)).map((row) => {
    const other = ofB.get(row.layer);
    const values = row.values.map((value, c) => {
      const k = bColumn[c];
      const against = k === null ? null : other.values[k];
      return value === null || against === null ? null : value - against;
    });
    return {layer: row.layer, values, flags: row.flags, envelope: row.envelope};
  });
  return withRange({rows, columns: a.columns, field: a.field, diverging: true, flags: a.flags});
}

/**
 * What the view shows of a run's /timeline `body`, minus another run's `other`
 * (or null): `{matrix, status}`, the matrix to draw and the line above it.
 * Two runs that share no layer have no difference to draw: `matrix` is then
 * null and `status` says so.
 */
export function timelineView(body, other = null) {
  const own = timelineMatrix(body);
  const matrix = other ? differenceMatrix(own, timelineMatrix(other)) : own;
  if (matrix.rows.length === 0 && other) {
    return {matrix: null, status: `No shared layers between run ${body.run} and run ${other.run}: nothing to `
      + 'subtract. Choose another run under "Minus run", or (none).'};
  }
  const columns = body.columns.first_step.length;
  const zoomed = (body.start ?? null) !== null || (body.end ?? null) !== null;
  const range = zoomed ? ` from step ${body.columns.first_step[0]} to ${body.columns.last_step.at(-1)}` : '';
  const status = `${body.layers.length} layers, ${body.steps} logged steps${range}`
    + (columns < body.steps ? ` in ${columns} columns` : '')
    + (body.level > 1 ? ` (read from the digest's level of ${body.level} events pooled a point)` : '')
    + (other ? `, minus ${other.run}` : '') + '.'
    + (zoomed ? ' Zoomed in: "Whole run" or Escape goes back.' : '') + budgetText(body.budget);
  return {matrix, status};
}

/** The index of the column whose step range holds `step`, or null (binary search). */
export function columnHolding(columns, step) {
  const first = columns.first_step;
  let lo = 0;
  let hi = first.length - 1;
  if (hi < 0 || step < first[0]) return null;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (first[mid] <= step) lo = mid;
    else hi = mid - 1;
  }
  return step <= columns.last_step[lo] ? lo : null;
}

/** The cell at a point of a drawing of `rows` x `columns` cells in a `width` x `height` box. */
export function cellAt(matrix, width, height, x, y) {
  const count = matrix.columns.first_step.length;
  if (x < 0 || y < 0 || x >= width || y >= height || !matrix.rows.length) return null;
  const row = Math.min(matrix.rows.length - 1, Math.floor((y / height) * matrix.rows.length));
  const column = Math.min(count - 1, Math.floor((x / width) * count));
  return {row, column};
}

/** What hovering a cell says: the layer, its steps, the value (or difference) and the flags. */
export function describeCell(matrix, {row, column}) {
  const r = matrix.rows[row];
  const first = matrix.columns.first_step[column];
  const last = matrix.columns.last_step[column];
  const steps = first === last ? `step ${first}` : `steps ${first}-${last}`;
  const title = FIELD_TITLES[matrix.field] ?? matrix.field;
  const value = r.values[column];
  let shown;
  if (matrix.diverging) {
    shown = value === null ? 'no value in both runs' : `${title}: ${value >= 0 ? '+' : ''}${value.toPrecision(3)} (A - B)`;
  } else {
    const low = r.envelope.min[column];
    const high = r.envelope.max[column];
    const name = r.format ? `${matrix.field} in ${r.format}` : matrix.field;
    const missing = r.notFinite?.[column] ? `${name} not finite (NaN / Inf)` : 'no value';
    shown = !Number.isFinite(high) ? missing : low === high ? `${name} ${fmt(high)}`
      : `${name} ${fmt(low)} to ${fmt(high)}`;
  }
  const flags = r.flags[column].length ? `; flags: ${r.flags[column].join(', ')}` : '';
  return `${r.layer}, ${steps}: ${shown}${flags}`;
}

function fmt(value) {
  return Number(value).toPrecision(3);
}

/** What the cost budget did, as the tab says it ('' without a budget). */
export function budgetText(budget) {
  if (!budget) return '';
  const percent = (share) => `${(100 * share).toPrecision(2)} %`;
  const share = Number.isFinite(budget.share) ? `; logging took ${percent(budget.share)} of training time` : '';
  return ` Logging budget ${percent(budget.budget)}: every ${budget.interval} (asked: every ${budget.asked_interval})`
    + `${share}, at step ${budget.step}.`;
}

/** A cell's colour for a value on [low, high]: a perceptual ramp, or blue-white-red for a difference. */
export function colourOf(value, low, high, diverging) {
  if (value === null) return null;
  const t = Math.min(1, Math.max(0, (value - low) / (high - low)));
  const stops = diverging ? DIVERGING : SEQUENTIAL;
  const scaled = t * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(scaled));
  const f = scaled - i;
  const mix = (k) => Math.round(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]));
  return [mix(0), mix(1), mix(2)];
}

// Viridis at five points; blue, white and red.
const SEQUENTIAL = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const DIVERGING = [[33, 102, 172], [247, 247, 247], [178, 24, 43]];
