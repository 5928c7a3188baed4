// Numbers for reading: axis ticks, label spacing, the count scale, and the
// text of values, counts, shapes and bin ranges. No DOM, so all of it runs
// under `node --test`.

// ------------------------------------------------------------ axes

/** Round tick values from 0 to at least `max`: 0, step, 2 step, ... */
export function linearTicks(max, target = 4) {
  if (!(max > 0)) return [0];
  const raw = max / target;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const ticks = [];
  for (let value = 0; value < max + step / 2; value += step) ticks.push(value);
  return ticks;
}

/**
 * Round values from `low` to `high` (both included when round), about `target` of them, a
 * multiple of 1, 2 or 5 times a power of ten apart; `integer`: at least 1 apart (steps).
 */
export function niceTicks(low, high, target = 5, {integer = false} = {}) {
  if (!(Number.isFinite(low) && Number.isFinite(high))) return [];
  if (!(high > low)) return [low];
  const raw = (high - low) / Math.max(1, target);
  const power = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let k = Math.ceil(low / step - 1e-9); k * step <= high + step * 1e-9; k++) {
    ticks.push(+(k * step).toPrecision(12));
  }
  return ticks;
}

/** Powers of ten from 1 to at least `max`, for a log count axis. */
export function logTicks(max) {
  const ticks = [1];
  while (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] * 10);
  return ticks;
}

/**
 * Keeps the labels that fit: `pinned` ones first, then the others in order,
 * each at least `minGap` away from every label kept.
 *
 * @param {{position: number, pinned?: boolean}[]} labels
 */
export function spacedLabels(labels, minGap) {
  const kept = [];
  const fits = (label) => kept.every((other) => Math.abs(other.position - label.position) >= minGap);
  for (const label of [...labels.filter((l) => l.pinned), ...labels.filter((l) => !l.pinned)]) {
    if (fits(label)) kept.push(label);
  }
  return kept.sort((a, b) => a.position - b.position);
}

/** Position of a count on a 0..1 axis; the log axis is log(1 + count) so 0 stays 0. */
export function countScale(count, max, logarithmic) {
  if (!(max > 0)) return 0;
  return logarithmic ? Math.log1p(count) / Math.log1p(max) : count / max;
}

// ------------------------------------------------------------ formatting

const SUPERSCRIPT = {'-': '⁻', 0: '⁰', 1: '¹', 2: '²', 3: '³', 4: '⁴', 5: '⁵', 6: '⁶', 7: '⁷', 8: '⁸', 9: '⁹'};

/** `1e-3` -> "10⁻³"; an edge between decades gets its number, e.g. "3.2e-4". */
export function edgeLabel(edge) {
  const exponent = Math.log10(edge);
  const rounded = Math.round(exponent);
  if (Math.abs(exponent - rounded) > 1e-9) return formatNumber(edge, 2);
  return '10' + [...String(rounded)].map((c) => SUPERSCRIPT[c]).join('');
}

/** True when an edge is a power of ten (where axes put a label). */
export function isDecade(edge) {
  const exponent = Math.log10(edge);
  return Math.abs(exponent - Math.round(exponent)) < 1e-9;
}

/** The values a signed magnitude bin holds, e.g. "1e-4 ≤ x < 3.16e-4". */
export function binRangeLabel(bins, sign, bin) {
  const {low, high} = bins[bin];
  const lowText = formatNumber(low, 3);
  const highText = formatNumber(high, 3);
  if (sign > 0) {
    if (low === 0) return `0 < x < ${highText}`;
    if (!Number.isFinite(high)) return `x ≥ ${lowText}`;
    return `${lowText} ≤ x < ${highText}`;
  }
  if (low === 0) return `−${highText} < x < 0`;
  if (!Number.isFinite(high)) return `x ≤ −${lowText}`;
  return `−${highText} < x ≤ −${lowText}`;
}

/** `[8, 28, 28, 64]` -> "8×28×28×64". */
export function formatShape(shape) {
  if (!Array.isArray(shape)) return '?';
  if (shape.length === 0) return 'scalar';
  return shape.map((n) => (n === null || n === undefined ? '?' : String(n))).join('×');
}

export function formatPercent(fraction, digits = 1) {
  if (!Number.isFinite(fraction)) return '—';
  return `${(fraction * 100).toFixed(digits)} %`;
}

export function formatCount(count) {
  if (!Number.isFinite(count)) return formatNumber(count);
  return Math.round(count).toLocaleString('en-US');
}

/** Short counts for axis labels: 1200 -> "1.2k". */
export function formatCompactCount(count) {
  for (const [size, suffix] of [[1e9, 'G'], [1e6, 'M'], [1e3, 'k']]) {
    if (count >= size) return `${+(count / size).toPrecision(2)}${suffix}`;
  }
  return String(count);
}

/** A float for reading: plain between 1e-3 and 1e4, scientific otherwise. */
export function formatNumber(value, digits = 3) {
  if (Number.isNaN(value)) return 'NaN';
  if (value === Infinity) return '∞';
  if (value === -Infinity) return '−∞';
  if (typeof value !== 'number') return '—';
  if (value === 0) return '0';
  const magnitude = Math.abs(value);
  const text = magnitude >= 1e-3 && magnitude < 1e4
    ? String(+value.toPrecision(digits))
    : value.toExponential(digits - 1).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return text.replace(/^-/, '−');
}
