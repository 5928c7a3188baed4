// Where steps lie across a drawing of columns of consecutive logged steps, and the step axis'
// ticks under it: the depth x time view's and the layer view's charts over steps share them.
// A column is `first_step[c]` to `last_step[c]` (one logged step, or several grouped); columns
// are equally wide. No DOM: runs under node.

import {niceTicks, spacedLabels} from './format.js';

// The least distance between two step labels and a tick per this many (CSS pixels).
const STEP_LABEL_GAP = 64;
const PIXELS_PER_STEP_TICK = 90;

// The last column whose first step is at or before `step` (0 before the first).
function columnAtOrBefore(first, step) {
  let lo = 0;
  let hi = first.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (first[mid] <= step) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Where `step` lies across a drawing of `columns` (`{first_step, last_step}`), from 0 (left
 * edge) to 1: inside its column in proportion to the steps the column spans, one logged step at
 * the middle of its column; a step between two columns between them.
 */
export function stepPosition(columns, step) {
  const {first_step: first, last_step: last} = columns;
  const n = first.length;
  if (!n) return 0.5;
  const inside = (c, s) => (c + (s - first[c] + 0.5) / (last[c] - first[c] + 1)) / n;
  if (step <= first[0]) return inside(0, first[0]);
  if (step >= last[n - 1]) return inside(n - 1, last[n - 1]);
  const c = columnAtOrBefore(first, step);
  if (step <= last[c]) return inside(c, step);
  const [from, to] = [inside(c, last[c]), inside(c + 1, first[c + 1])];
  return from + ((step - last[c]) / (first[c + 1] - last[c])) * (to - from);
}

/**
 * The step nearest `step` that a column of `columns` holds: `step` itself when a column spans
 * it, else the closer of the last step of the column before it and the first of the one after.
 */
export function heldStep(columns, step) {
  const {first_step: first, last_step: last} = columns;
  const n = first.length;
  if (step <= first[0]) return first[0];
  if (step >= last[n - 1]) return last[n - 1];
  const c = columnAtOrBefore(first, step);
  if (step <= last[c]) return step;
  return step - last[c] <= first[c + 1] - step ? last[c] : first[c + 1];
}

/**
 * The step axis under a drawing `width` pixels wide: about one tick per `PIXELS_PER_STEP_TICK`
 * pixels, each at a step that a column holds (never a label for a step that was not logged, nor
 * drawn): round steps where a column holds them, else the logged step nearest each round one.
 * `{step, x}`, `x` in pixels at the step's `stepPosition`; ticks closer than `STEP_LABEL_GAP` to
 * one kept are left out.
 */
export function stepTicks(columns, width) {
  const n = columns.first_step.length;
  if (!n || !(width > 0)) return [];
  const target = Math.max(2, Math.floor(width / PIXELS_PER_STEP_TICK));
  const round = niceTicks(columns.first_step[0], columns.last_step[n - 1], target, {integer: true});
  const steps = [...new Set(round.map((step) => heldStep(columns, step)))];
  const placed = steps.map((step) => ({step, position: stepPosition(columns, step) * width}));
  return spacedLabels(placed, STEP_LABEL_GAP).map(({step, position}) => ({step, x: position}));
}
