// Shaping /step answers for the gradient-flow view: the layers along the x
// axis and their short names, one value per layer for each line, the ranges
// of the log axes. No DOM, so all of it runs under `node --test`.

import {UPDATE_RATIO_GUIDE, formatPercent} from './model.js';

// The panels, top to bottom, in the order the issue names them: gradients
// vanish or explode on their way from the output toward the input.
export const FLOW_ROLES = ['output_gradient', 'input_gradient', 'activation'];

// With `weights=True`, a panel of the weights' gradients below those, and one
// of each layer's update ratio (its weights as one vector) at the bottom.
export const WEIGHT_GRADIENT = 'weight_gradient';

/** The statistics of /step's `flow` drawn on each panel's log axis. */
export const LOG_STATS = ['rms', 'max_abs'];

/** The flags /step raises, in its order (docs/API.md): a row of badges each. */
export const FLAGS = ['nonfinite', 'vanishing', 'exploding', 'dead', 'underflow', 'overflow', 'block_underflow', 'stalled', 'skipped_steps'];

// ------------------------------------------------------------ layer names

/**
 * Short labels for the x axis. The path components every name shares are
 * dropped (the `resnet50/` of a nested model; the nested model itself keeps
 * its own name). A label still longer than `maxChars` keeps its last
 * components, as few as leave it unique, and is cut in the middle if even
 * those are too long. The full path goes on hover.
 *
 * @param {string[]} names layer paths, `/`-separated.
 * @returns {string[]} one label per name.
 */
export function shortLayerNames(names, maxChars = 24) {
  const paths = names.map((name) => name.split('/'));
  let common = 0;
  while (paths.length > 0 && paths.every((parts) => parts.length > common && parts[common] === paths[0][common])) {
    common++;
  }
  const rests = paths.map((parts) => (parts.length > common ? parts.slice(common) : parts.slice(-1)));
  const suffix = (parts, k) => parts.slice(-k).join('/');
  return rests.map((parts) => {
    const full = parts.join('/');
    if (full.length <= maxChars) return full;
    let k = 1;
    while (k < parts.length && rests.some((other) => other !== parts && suffix(other, k) === suffix(parts, k))) k++;
    return middleEllipsis(suffix(parts, k), maxChars);
  });
}

/** `text` cut to `maxChars` characters with "…" in the middle, where names tend to differ least. */
export function middleEllipsis(text, maxChars) {
  if (text.length <= maxChars) return text;
  const tail = Math.ceil((maxChars - 1) / 2);
  return `${text.slice(0, maxChars - 1 - tail)}…${text.slice(text.length - tail)}`;
}

// ------------------------------------------------------------ x axis

/**
 * The x axis of two runs' layers, each list in model order: a layer both
 * runs have shares a slot, and the layers only one run has are placed
 * between their neighbours, by relative depth. With nothing in common, the
 * two runs are spread over the same width by depth.
 *
 * @param {string[]} primary layer names of the run the view is about.
 * @param {?string[]} other layer names of the overlaid run, or null.
 * @returns {{primary: ?string, other: ?string}[]} the slots, left to right.
 */
export function alignLayers(primary, other) {
  const slots = primary.map((name, i) => ({position: i, rank: 0, primary: name, other: null}));
  if (!other) return slots.map(({primary: name}) => ({primary: name, other: null}));
  const index = new Map(primary.map((name, i) => [name, i]));
  // Shared names in the same order in both runs anchor the alignment.
  const anchors = [[-1, -1]];
  other.forEach((name, j) => {
    const i = index.get(name);
    if (i !== undefined && i > anchors[anchors.length - 1][0]) anchors.push([i, j]);
  });
  anchors.push([primary.length, other.length]);
  for (const [i, j] of anchors.slice(1, -1)) slots[i].other = other[j];
  let a = 0;
  other.forEach((name, j) => {
    while (anchors[a + 1][1] < j) a++;
    if (anchors[a + 1][1] === j) return;
    const [i0, j0] = anchors[a];
    const [i1, j1] = anchors[a + 1];
    slots.push({position: i0 + ((j - j0) / (j1 - j0)) * (i1 - i0), rank: 1, primary: null, other: name});
  });
  slots.sort((x, y) => x.position - y.position || x.rank - y.rank);
  return slots.map(({primary: p, other: o}) => ({primary: p, other: o}));
}

/** The name a slot is labelled with: the primary run's, else the overlaid run's. */
export function slotName(slot) {
  return slot.primary ?? slot.other;
}

// ------------------------------------------------------------ panels

/**
 * The roles the view draws a panel for, top to bottom: the three of every
 * layer, then the weight gradient when a layer of the runs shown (their
 * /runs entries) logged one. Decided from /runs, not from a step, so that
 * the panels stay put while the slider moves.
 */
export function flowRoles(runEntries) {
  const weights = runEntries.some((entry) => entry?.layers.some((layer) =>
    layer.tensors.some(({role}) => role === WEIGHT_GRADIENT)));
  return weights ? [...FLOW_ROLES, WEIGHT_GRADIENT] : [...FLOW_ROLES];
}

/** Whether a layer of the runs shown has update records: then the view has an update-ratio panel. */
export function hasUpdates(runEntries) {
  return runEntries.some((entry) => entry?.layers.some((layer) => (layer.updates ?? []).length > 0));
}

// ------------------------------------------------------------ lines

/**
 * One line of the view: the `flow` values of one run at one step, per role
 * and statistic, one per slot. `side` says which name of a slot is this
 * run's ('primary' or 'other'). A slot the run does not have, or whose layer
 * has no tensor of that role, is null; a served NaN stays NaN.
 *
 * @returns {{[role: string]: {rms: ?number[], max_abs: ?number[], zero_fraction: ?number[]}}}
 */
export function flowLine(snapshot, slots, side, roles = FLOW_ROLES) {
  const layers = slotLayers(snapshot, slots, side);
  return Object.fromEntries(roles.map((role) => [role, Object.fromEntries(
    [...LOG_STATS, 'zero_fraction'].map((stat) => [stat, layers.map((layer) => layer?.flow?.[role]?.[stat] ?? null)]),
  )]));
}

/**
 * Each slot's layer update ratio in one /step answer (`update_ratio`: the
 * layer's weights taken as one vector): null where the run lacks the layer
 * or the layer has no update at or before the step; a served NaN stays NaN.
 */
export function updateRatioLine(snapshot, slots, side) {
  return slotLayers(snapshot, slots, side).map((layer) => layer?.update_ratio ?? null);
}

function slotLayers(snapshot, slots, side) {
  const byName = new Map(snapshot.layers.map((layer) => [layer.layer, layer]));
  return slots.map((slot) => (slot[side] === null ? undefined : byName.get(slot[side])));
}

/** The raised flags of each slot's layer in one /step answer (an empty list where none). */
export function slotFlags(snapshot, slots, side) {
  const byName = new Map(snapshot.layers.map((layer) => [layer.layer, layer.flags ?? []]));
  return slots.map((slot) => (slot[side] === null ? [] : byName.get(slot[side]) ?? []));
}

/**
 * The polylines of a line: runs of indices whose value can be drawn
 * (`drawable`). A value that cannot (NaN) breaks the line; a slot the run
 * does not have (null) is stepped over, so that a run with fewer layers than
 * the other still reads as one line.
 */
export function drawableRuns(values, drawable) {
  const runs = [];
  let current = null;
  values.forEach((value, i) => {
    if (value === null) return;
    if (drawable(value)) {
      if (!current) runs.push((current = []));
      current.push(i);
    } else {
      current = null;
    }
  });
  return runs;
}

/** Whether a value goes on a log axis (zero goes on its own row below it). */
export function onLogAxis(value) {
  return Number.isFinite(value) && value > 0;
}

/** Whether a value is drawn on a log panel at all: on its axis, or on the zero row. */
export function drawableOnLogPanel(value) {
  return value === 0 || onLogAxis(value);
}

// ------------------------------------------------------------ log axis

/**
 * The decades a log axis spans to hold every positive finite value of the
 * lists (null entries, NaN, Infinity and zeros are left out): `{low, high}`
 * exponents of ten, at least one decade apart. Null when no value fits.
 *
 * @param {?number[][]} lists
 */
export function logRange(lists) {
  let min = Infinity;
  let max = -Infinity;
  for (const values of lists) {
    for (const value of values ?? []) {
      if (onLogAxis(value)) {
        min = Math.min(min, value);
        max = Math.max(max, value);
      }
    }
  }
  if (!(min <= max)) return null;
  // Rounded first, so that an exact power of ten is its own decade.
  const low = Math.floor(Number(Math.log10(min).toFixed(9)));
  const high = Math.max(low + 1, Math.ceil(Number(Math.log10(max).toFixed(9))));
  return {low: low + 0, high: high + 0}; // + 0: no -0 from ceil of a value in (-1, 0)
}

/** The log axis of update ratios: their values' decades, widened to hold the healthy ~1e-3 guide. */
export function updateRatioRange(lists) {
  return logRange([...lists, [UPDATE_RATIO_GUIDE]]);
}

/** Where a positive value sits on a log axis, 0 at the bottom to 1 at the top. */
export function logPosition(value, range) {
  return (Math.log10(value) - range.low) / (range.high - range.low);
}

/** The exponents to label on a log axis: every decade, or every n-th so that at most `maxTicks` remain. */
export function decadeTicks(range, maxTicks = 6) {
  const every = Math.max(1, Math.ceil((range.high - range.low) / Math.max(1, maxTicks - 1)));
  const ticks = [];
  for (let exponent = range.high; exponent >= range.low; exponent -= every) ticks.unshift(exponent);
  return ticks;
}

/** Whether any value of the lists is an exact zero (the log panels then show their zero row). */
export function hasZero(lists) {
  return lists.some((values) => (values ?? []).some((value) => value === 0));
}

// ------------------------------------------------------------ steps

/** The steps kept as extra lines, with `step` added: sorted, no repeats, at most `max` (the latest kept). */
export function keepStep(kept, step, max = 4) {
  return [...new Set([...kept, step])].sort((a, b) => a - b).slice(-max);
}

/**
 * The lines the gradient flow asks /step for: each shown run (the tab's,
 * then the overlaid one) at the slider's step, then at each kept step.
 */
export function wantedLines(run, flowRun, step, keptSteps) {
  const steps = [step, ...keptSteps.filter((s) => s !== step)];
  return (flowRun ? [run, flowRun] : [run]).flatMap((name, series) =>
    steps.map((s, pin) => ({run: name, series, pin, side: series === 0 ? 'primary' : 'other', requested: s})));
}

/**
 * The lines to draw: each wanted line with its /step snapshot, leaving out
 * those with none (null) and those whose logged step an earlier line of the
 * same run already draws (two steps asked for can be served by one).
 */
export function distinctLines(wanted, snapshots) {
  const seen = new Set();
  return wanted.map((line, i) => ({...line, snapshot: snapshots[i]})).filter(({series, snapshot}) => {
    const key = snapshot && `${series} ${snapshot.step}`;
    const fresh = snapshot !== null && !seen.has(key);
    seen.add(key);
    return fresh;
  });
}

// ------------------------------------------------------------ flush to zero

/** The roles whose flush share the view draws: the gradients. */
export const FLUSH_ROLES = ['output_gradient', 'input_gradient', WEIGHT_GRADIENT];

/** How a flush share is labelled: "flushes in bfloat16", or "would flush in float16". */
export function flushLabel({format, computes}) {
  return `${computes ? 'flushes' : 'would flush'} in ${format}`;
}

/** A flush share as the hover words it: "0.52 % would flush in float16 (2 of 384)". */
export function flushText(flush) {
  return `${formatPercent(flush.share, 2)} ${flushLabel(flush)} (${flush.flushed} of ${flush.total})`;
}

/**
 * The share of one role's finite non-zero values in a /step layer that flush
 * to zero, as the server sends it (the layer's `flush_share`, docs/API.md: the
 * server decides the format and pools the role's tensors; the page shows it
 * and never computes it). Null when the layer has no tensor of that role or
 * one of them has no precision record; `share` is NaN when none of the values
 * is finite and non-zero.
 *
 * @returns {?{share: number, format: string, computes: boolean, flushed: number, total: number}}
 */
export function flushShare(layer, role) {
  return layer?.flush_share?.[role] ?? null;
}

/**
 * One line's flush shares: per gradient role among `roles`, each slot's
 * `flushShare` (null where the run lacks the layer or it has no record).
 *
 * @returns {{[role: string]: ?object[]}}
 */
export function flushLine(snapshot, slots, side, roles = FLOW_ROLES) {
  const layers = slotLayers(snapshot, slots, side);
  return Object.fromEntries(roles.filter((role) => FLUSH_ROLES.includes(role))
    .map((role) => [role, layers.map((layer) => flushShare(layer, role))]));
}

/** The labels of the flush shares in the lines (`flushLine` values of one role), each once, in order. */
export function flushLabels(lists) {
  const labels = lists.flatMap((shares) => (shares ?? []).filter(Boolean).map(flushLabel));
  return [...new Set(labels)];
}
