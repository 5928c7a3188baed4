import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as model from '../../frontend/model.js';

// The magnitude bin edges of docs/FORMAT.md: half decades from 1e-12 to 1e6.
const EDGES = Array.from({length: 37}, (_, i) => 10 ** ((i - 24) / 2));
const BIN_COUNT = EDGES.length + 1;

function bins(entries) {
  const counts = new Array(BIN_COUNT).fill(0);
  for (const [index, count] of Object.entries(entries)) counts[index] = count;
  return counts;
}

// A /series answer of a 2x2/2 max pool's input gradient, two steps, as the
// plugin encodes it (non-finite floats as strings).
const SERIES_TEXT = JSON.stringify({
  run: 'cnn', layer: 'NaN', tensor: 'input_gradient', role: 'input_gradient',
  shape: [8, 28, 28, 16], dtype: 'float32', steps: [10, 20], wall_times: [1, 2],
  stats: {
    count: [100352, 100352], zeros: [75264, 75300], nan: [0, 3], pos_inf: [0, 1], neg_inf: [0, 0],
    min: [-0.01, 'NaN'], max: [0.02, 'Infinity'], mean: [1e-6, 2e-6], std: [0.001, 0.001],
    sum: [0.1, '-Infinity'],
  },
  histogram: {buckets: 30, low: [-0.01, null], high: [0.02, null], counts: [new Array(30).fill(1), null]},
  log: {
    edges: EDGES,
    negative: [bins({15: 10000, 16: 2544}), bins({14: 5, 15: 12000})],
    positive: [bins({17: 12544}), bins({17: 13040})],
  },
});

test('non-finite strings become numbers, names stay strings', () => {
  const series = model.parseApiJson(SERIES_TEXT);
  assert.equal(series.layer, 'NaN');
  assert.ok(Number.isNaN(series.stats.min[1]));
  assert.equal(series.stats.max[1], Infinity);
  assert.equal(series.stats.sum[1], -Infinity);
  assert.equal(series.stats.min[0], -0.01);
  assert.equal(model.parseApiJson('{"runs":[{"run":"Infinity","layers":[]}]}').runs[0].run, 'Infinity');
});

test('routeUrl is relative and escapes names', () => {
  assert.equal(model.routeUrl('runs'), 'runs');
  assert.equal(
    model.routeUrl('series', {run: 'a b', layer: 'resnet50/pool1_pool', tensor: 'activation'}),
    'series?run=a+b&layer=resnet50%2Fpool1_pool&tensor=activation',
  );
  assert.equal(model.routeUrl('step', {run: 'r&x=1', step: undefined}), 'step?run=r%26x%3D1');
});

test('fetchJson decodes the body and reports HTTP errors with status and message', async () => {
  const requested = [];
  const fakeFetch = async (url) => {
    requested.push(url);
    if (url.startsWith('series')) return {ok: true, status: 200, text: async () => SERIES_TEXT};
    return {ok: false, status: 404, text: async () => 'Unknown run: "x"\n'};
  };
  const series = await model.fetchSeries('cnn', 'NaN', 'input_gradient', fakeFetch);
  assert.equal(series.stats.max[1], Infinity);
  assert.deepEqual(requested, ['series?run=cnn&layer=NaN&tensor=input_gradient']);
  await assert.rejects(model.fetchStep('x', 3, fakeFetch), (error) => {
    assert.equal(error.status, 404);
    assert.equal(error.message, 'step?run=x&step=3: 404 Unknown run: "x"');
    return true;
  });
});

test('visibleRuns follows the host run list, or keeps all without a host', () => {
  const runs = [{run: 'a'}, {run: 'b'}, {run: 'c'}];
  assert.deepEqual(model.visibleRuns(runs, null), runs);
  assert.deepEqual(model.visibleRuns(runs, ['c', 'a', 'z']).map((r) => r.run), ['a', 'c']);
});

test('tensor names group by role', () => {
  assert.equal(model.tensorRole('input_gradient_1'), 'input_gradient');
  assert.equal(model.tensorRole('activation'), 'activation');
  assert.deepEqual(
    model.tensorsByRole(['activation', 'input_gradient_0', 'input_gradient_1', 'output_gradient']),
    {activation: ['activation'], input_gradient: ['input_gradient_0', 'input_gradient_1'], output_gradient: ['output_gradient']},
  );
  assert.equal(model.tensorSide('input_gradient'), 'input');
  assert.equal(model.tensorSide('output_gradient'), 'output');
  assert.equal(model.tensorSide('activation'), 'output');
});

test('latestIndexAtOrBefore finds the step the slider lands on', () => {
  const steps = [10, 20, 40];
  assert.equal(model.latestIndexAtOrBefore(steps, 5), -1);
  assert.equal(model.latestIndexAtOrBefore(steps, 10), 0);
  assert.equal(model.latestIndexAtOrBefore(steps, 39), 1);
  assert.equal(model.latestIndexAtOrBefore(steps, 1000), 2);
  assert.deepEqual(model.unionSteps([[20, 10], [10, 30]]), [10, 20, 30]);
});

test('snapshotAt takes the latest step at or before the asked one', () => {
  const series = model.parseApiJson(SERIES_TEXT);
  const first = model.snapshotAt(series, 15);
  assert.equal(first.step, 10);
  assert.equal(first.stats.zeros, 75264);
  assert.equal(first.negative[16], 2544);
  assert.equal(first.histogram.low, -0.01);
  const second = model.snapshotAt(series, 20);
  assert.equal(second.histogram, null);
  assert.equal(model.nonFiniteCount(second.stats), 4);
  assert.equal(model.snapshotAt(series, 9), null);
});

test('zero fraction of a 2x2/2 max pool input gradient is 75 %', () => {
  const stats = model.snapshotAt(model.parseApiJson(SERIES_TEXT), 10).stats;
  assert.equal(model.zeroFraction(stats), 0.75);
  assert.equal(model.formatPercent(model.zeroFraction(stats)), '75.0 %');
  assert.ok(Number.isNaN(model.zeroFraction({count: 0, zeros: 0})));
});

test('routed fraction against the window geometry', () => {
  const routing = model.routingAt({
    steps: [10, 20], input_positions: [100352, 100352], routed_positions: [25088, 21000],
    windows: [25088, 25088], tied_windows: [0, 7],
    input_gradient_sum: [0.5, 0.5], output_gradient_sum: [0.5, 0.5], output_gradient_abs_sum: [0.9, 0.8],
    mass: {difference: [0, 1e-9], relative: [0, 1.25e-9], tolerance: [1.9e-6, 1.9e-6], conserved: [true, false]},
  }, 25);
  assert.equal(routing.step, 20);
  // The server's verdict at that step, carried as it is.
  assert.deepEqual(routing.mass, {difference: 1e-9, relative: 1.25e-9, tolerance: 1.9e-6, conserved: false});
  const maxPool = {type: 'max', global: false, pool_size: [2, 2], strides: [2, 2]};
  assert.equal(model.predictedRoutedFraction(routing, maxPool), 0.25);
  assert.ok(Number.isNaN(model.predictedRoutedFraction(routing, {...maxPool, type: 'avg'})));
  assert.equal(model.windowsOverlap(maxPool), false);
  assert.equal(model.windowsOverlap({...maxPool, pool_size: [3, 3]}), true);
  assert.equal(model.windowsOverlap({type: 'max', global: true, pool_size: null, strides: null}), false);
  assert.equal(model.routedFraction(routing), 21000 / 100352);
  assert.equal(routing.tied_windows, 7);
});

test('magnitude bins follow the edges, with open-ended first and last bins', () => {
  const all = model.magnitudeBins(EDGES);
  assert.equal(all.length, 38);
  assert.deepEqual(all[0], {index: 0, low: 0, high: 1e-12});
  assert.equal(all[18].low, EDGES[17]);
  assert.equal(all[18].high, EDGES[18]);
  assert.equal(all[37].high, Infinity);
  assert.equal(model.binRangeLabel(all, 1, 37), 'x ≥ 1e6');
  assert.equal(model.binRangeLabel(all, -1, 0), '−1e-12 < x < 0');
  assert.equal(model.binRangeLabel(all, 1, 17), '1e-4 ≤ x < 3.16e-4');
  assert.equal(model.binRangeLabel(all, -1, 17), '−3.16e-4 < x ≤ −1e-4');
  assert.equal(model.binRangeLabel(all, 1, 25), '1 ≤ x < 3.16');
});

test('occupied range spans every step and both signs, padded to decades', () => {
  const series = model.parseApiJson(SERIES_TEXT);
  const range = model.seriesRange(series);
  assert.deepEqual(range, {first: 14, last: 17});
  // Bin 14 starts at 10^-5.5, bin 17 ends at 10^-3.5: widen to 1e-6 .. 1e-3.
  assert.deepEqual(model.padToDecades(range, EDGES), {first: 13, last: 18});
  assert.equal(model.occupiedRange([bins({}), null]), null);
});

test('signed bars mirror the negative bins to the left', () => {
  const bars = model.signedBars(bins({15: 4, 16: 1}), bins({17: 9}), {first: 15, last: 17});
  assert.deepEqual(bars.map((b) => [b.sign, b.bin, b.count]), [
    [-1, 17, 0], [-1, 16, 1], [-1, 15, 4], [1, 15, 0], [1, 16, 0], [1, 17, 9],
  ]);
});

test('distribution over steps puts zeros in the middle row, as fractions of all elements', () => {
  const series = model.parseApiJson(SERIES_TEXT);
  const grid = model.distributionOverSteps(series, {first: 16, last: 17});
  assert.deepEqual(grid.steps, [10, 20]);
  assert.deepEqual(grid.rows, [
    {sign: 1, bin: 17}, {sign: 1, bin: 16}, {sign: 0, bin: -1}, {sign: -1, bin: 16}, {sign: -1, bin: 17},
  ]);
  assert.equal(grid.cells[0][0], 12544 / 100352);
  assert.equal(grid.cells[2][0], 0.75);
  assert.equal(grid.cells[3][0], 2544 / 100352);
  assert.equal(grid.cells[3][1], 0);
});

test('evenlySpacedIndices keeps the ends', () => {
  assert.deepEqual(model.evenlySpacedIndices(3, 10), [0, 1, 2]);
  assert.deepEqual(model.evenlySpacedIndices(11, 3), [0, 5, 10]);
  assert.deepEqual(model.evenlySpacedIndices(5, 1), [4]);
});

test('axis ticks', () => {
  assert.deepEqual(model.linearTicks(12544), [0, 5000, 10000, 15000]);
  assert.deepEqual(model.linearTicks(1), [0, 0.5, 1]);
  assert.deepEqual(model.logTicks(12544), [1, 10, 100, 1000, 10000, 100000]);
  assert.equal(model.countScale(0, 100, true), 0);
  assert.equal(model.countScale(100, 100, true), 1);
  assert.equal(model.countScale(25, 100, false), 0.25);
  assert.equal(model.countScale(5, 0, false), 0);
});

test('formatting numbers, shapes and labels', () => {
  assert.equal(model.formatShape([8, 28, 28, 64]), '8×28×28×64');
  assert.equal(model.formatShape([null, 10]), '?×10');
  assert.equal(model.formatShape([]), 'scalar');
  assert.equal(model.formatCount(100352), '100,352');
  assert.equal(model.formatCompactCount(12544), '13k');
  assert.equal(model.formatCompactCount(1000000), '1M');
  assert.equal(model.formatCompactCount(999), '999');
  assert.equal(model.formatNumber(0.000123456), '1.23e-4');
  assert.equal(model.formatNumber(-0.0123456), '−0.0123');
  assert.equal(model.formatNumber(2e6), '2e6');
  assert.equal(model.formatNumber(NaN), 'NaN');
  assert.equal(model.formatNumber(-Infinity), '−∞');
  assert.equal(model.formatNumber(0), '0');
  assert.equal(model.formatPercent(NaN), '—');
  assert.equal(model.edgeLabel(1e-3), '10⁻³');
  assert.equal(model.edgeLabel(1e6), '10⁶');
  assert.equal(model.edgeLabel(1), '10⁰');
  assert.equal(model.isDecade(EDGES[24]), true);
  assert.equal(model.isDecade(EDGES[25]), false);
  assert.equal(
    model.describePooling({type: 'max', global: false, pool_size: [2, 2], strides: [2, 2], padding: 'valid'}),
    'max pool 2×2, stride 2×2, valid',
  );
  assert.equal(model.describePooling({type: 'avg', global: true}), 'global average pool');
});

test('spacedLabels keeps pinned labels and drops the ones that would overlap', () => {
  const labels = [0, 5, 10, 15, 20, 25].map((position) => ({position, pinned: position === 15}));
  assert.deepEqual(model.spacedLabels(labels, 12).map((l) => l.position), [0, 15]);
  assert.deepEqual(model.spacedLabels(labels, 5).map((l) => l.position), [0, 5, 10, 15, 20, 25]);
  assert.deepEqual(model.spacedLabels([], 5), []);
});
