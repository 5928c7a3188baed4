// The magnitude bins of the stats record (docs/API.md, `log`): their ranges,
// the range a series occupies, and the bars of the symmetric-log histogram.
// No DOM, so all of it runs under `node --test`.

import {isDecade} from './format.js';

/**
 * The magnitude bins of the log edges: bin 0 is `0 < |x| < edges[0]`, bin j is
 * `edges[j-1] <= |x| < edges[j]`, the last is `|x| >= edges[last]`.
 */
export function magnitudeBins(edges) {
  const bins = [{index: 0, low: 0, high: edges[0]}];
  for (let j = 1; j < edges.length; j++) bins.push({index: j, low: edges[j - 1], high: edges[j]});
  bins.push({index: edges.length, low: edges[edges.length - 1], high: Infinity});
  return bins;
}

/** The first and last bin index holding a count in any of the lists, or null. */
export function occupiedRange(binLists) {
  let first = Infinity;
  let last = -Infinity;
  for (const bins of binLists) {
    if (!bins) continue;
    bins.forEach((count, index) => {
      if (count > 0) {
        first = Math.min(first, index);
        last = Math.max(last, index);
      }
    });
  }
  return first <= last ? {first, last} : null;
}

/** The occupied bin range of every step of a series, both signs. */
export function seriesRange(series) {
  return occupiedRange([...series.log.negative, ...series.log.positive]);
}

/** Widens a bin range to whole decades, so that an axis starts and ends on a label. */
export function padToDecades(range, edges) {
  if (!range) return range;
  let {first, last} = range;
  while (first > 0 && !isDecade(edges[first - 1])) first--;
  while (last < edges.length && !isDecade(edges[last])) last++;
  return {first, last};
}

/**
 * The bars of the symmetric-log histogram, left to right: negative values by
 * falling magnitude (the largest negative at the far left), then positive
 * values by rising magnitude. Zeros are not among them.
 */
export function signedBars(negative, positive, range) {
  const bars = [];
  for (let j = range.last; j >= range.first; j--) bars.push({sign: -1, bin: j, count: negative[j]});
  for (let j = range.first; j <= range.last; j++) bars.push({sign: 1, bin: j, count: positive[j]});
  return bars;
}
