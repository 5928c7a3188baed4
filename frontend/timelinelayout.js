// The depth x time view's geometry and scales: how tall a row is and which
// rows carry their name, where a step lies across the columns of /timeline
// and the step axis' ticks (stepaxis.js'), the colour bar's ticks and title,
// and the steps a drag across the drawing picks. No DOM: runs under node.

import {edgeLabel, formatNumber, niceTicks} from './format.js';
import {LOG_FIELDS} from './timelinemodel.js';

export {stepPosition, stepTicks} from './stepaxis.js';

/** The width of the column of layer names left of the drawing (CSS pixels). */
export const NAMES_WIDTH = 180;
/** The room kept right of the drawing for the rows' scroll bar (CSS pixels). */
export const SCROLLBAR_WIDTH = 16;
/** The rows grow with the layers up to this height; past it they scroll (CSS pixels). */
export const MAX_HEIGHT = 480;
/**
 * Up to this many layers, every row is tall enough to carry its name (the rows then scroll);
 * past it, a drawing of named rows would take more memory than a page should (its canvas).
 */
export const ALL_NAMED_UP_TO = 500;
// A row that carries its name in the names' 11 px type; the least and the most a row is tall.
const NAMED_ROW = 12;
const MIN_ROW = 8;
const MAX_ROW = 24;

/**
 * The rows of `count` layers: `{rowHeight, height, viewport, labelEvery}`. Rows fill up to
 * `MAX_HEIGHT` at most `MAX_ROW` tall; up to `ALL_NAMED_UP_TO` layers each is at least
 * `NAMED_ROW` tall and named, beyond that at least `MIN_ROW`, and every `labelEvery`-th
 * row carries its name, at least `NAMED_ROW` apart. `height` is every row's, `viewport`
 * what is shown before the rows scroll: whole rows, so that no name is cut.
 */
export function rowLayout(count) {
  const rows = Math.max(1, count);
  const least = rows <= ALL_NAMED_UP_TO ? NAMED_ROW : MIN_ROW;
  const rowHeight = Math.max(least, Math.min(MAX_ROW, Math.floor(MAX_HEIGHT / rows)));
  const height = rowHeight * rows;
  const viewport = Math.min(height, Math.floor(MAX_HEIGHT / rowHeight) * rowHeight);
  return {rowHeight, height, viewport, labelEvery: Math.ceil(NAMED_ROW / rowHeight)};
}

/**
 * The rows a scroll `top` pixels down a view of `rows` (`rowLayout`) of `count` layers shows
 * whole: `{first, last}`, 1-based, as the note under the rows says them.
 */
export function rowsShown(rows, count, top) {
  const first = Math.min(count, Math.ceil(top / rows.rowHeight - 1e-6) + 1);
  const last = Math.min(count, Math.floor((top + rows.viewport) / rows.rowHeight + 1e-6));
  return {first, last: Math.max(first, last)};
}

/** The drawing's width in CSS pixels in a chart `containerWidth` wide (the names and scroll bar aside). */
export function plotWidth(containerWidth) {
  return Math.max(0, Math.floor(containerWidth) - NAMES_WIDTH - SCROLLBAR_WIDTH);
}

/** The column under a point `x` pixels from the left of a drawing `width` wide (clamped to it). */
export function columnAtX(columns, width, x) {
  const n = columns.first_step.length;
  return Math.max(0, Math.min(n - 1, Math.floor((x / width) * n)));
}

/**
 * The steps a drag from `x0` to `x1` (pixels, either order) over a drawing `width` wide
 * picks: `{start, end}`, the first step of the column under the left end to the last step of
 * the column under the right end.
 */
export function dragRange(columns, width, x0, x1) {
  const left = columnAtX(columns, width, Math.min(x0, x1));
  const right = columnAtX(columns, width, Math.max(x0, x1));
  return {start: columns.first_step[left], end: columns.last_step[right]};
}

const FIELD_NAMES = {
  rms: 'RMS', max_abs: 'largest |x|', zero_share: 'share of exact zeros', update_ratio: 'update ratio',
  flush_share: 'share that flushes to zero', block_zero_share: 'MXFP8 E4M3 share to zero',
};
const ROLE_NAMES = {
  output_gradient: 'the output gradient', input_gradient: 'the input gradient', activation: 'the activation',
  weight: 'the weights',
};

/** The colour bar's title: what the colour shows, of what, and on which scale. */
export function colourTitle(field, role, diverging) {
  const name = `${FIELD_NAMES[field] ?? field} of ${ROLE_NAMES[role] ?? role}`;
  const what = name[0].toUpperCase() + name.slice(1);
  if (diverging) return `${what}: run A − run B, in ${LOG_FIELDS.has(field) ? 'decades (log10)' : 'share'}`;
  return LOG_FIELDS.has(field) ? `${what}, log scale` : `${what}, 0 to 100 %`;
}

/**
 * The colour bar's ticks over `[low, high]` (the matrix' scale: log10 of a log field, a share
 * otherwise, a difference when `diverging`): `{value, label}`, the value on that scale and the
 * label in the field's units ("10⁻³" at a decade, "25 %" of a share).
 */
export function colourTicks(field, low, high, diverging) {
  const log = LOG_FIELDS.has(field);
  const decades = log && !diverging && high - low >= 2;
  return niceTicks(low, high, 4, {integer: decades}).map((value) => {
    let label;
    if (diverging) label = `${value > 0 ? '+' : ''}${log ? formatNumber(value, 2) : `${+(value * 100).toPrecision(3)} %`}`;
    else if (log) label = edgeLabel(10 ** value);
    else label = `${+(value * 100).toPrecision(3)} %`;
    return {value, label: label.replace(/^-/, '−')};
  });
}
