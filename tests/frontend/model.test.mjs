// model.js over real API answers (api_answers.mjs): a small CNN trained with
// GradVizCallback, runs "clean" and "nan" (a NaN in the probe batch), layers
// conv, pool (2x2/2 max), avg (2x2/2 average) and add (two inputs), steps 2 and 4;
// run "vanishing", whose layers the training-health flags catch; and run "relu"
// (pools over ReLU zeros, for the routing map: routemap.test.mjs).

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as model from '../../frontend/model.js';
import {answer, body, layerOf, recordedFetch, runs, series} from './api_answers.mjs';

const sum = (values) => values.reduce((a, b) => a + b, 0);

test('the served "NaN" strings become numbers, names stay strings', () => {
  const text = body('routing', {run: 'clean', layer: 'avg'});
  // An average pool has no tied windows: the server writes NaN, as a string.
  assert.deepEqual(JSON.parse(text).tied_windows, ['NaN', 'NaN']);
  assert.ok(model.parseApiJson(text).tied_windows.every(Number.isNaN));
  assert.equal(model.parseApiJson(text).layer, 'avg');
  // A layer or run may well be called "NaN": under a name key it stays text.
  assert.equal(model.reviveNonFinite('layer', 'NaN'), 'NaN');
  assert.equal(model.reviveNonFinite('run', 'Infinity'), 'Infinity');
  assert.ok(Number.isNaN(model.reviveNonFinite('min', 'NaN')));
  assert.equal(model.reviveNonFinite('max', 'Infinity'), Infinity);
  assert.equal(model.reviveNonFinite('sum', '-Infinity'), -Infinity);
});

test('names of layers stay strings, a reference layer called "NaN" too', () => {
  const text = body('step', {run: 'vanishing'}).replace('"reference_layer": "head"', '"reference_layer": "NaN"');
  assert.notEqual(text, body('step', {run: 'vanishing'}));
  assert.equal(model.parseApiJson(text).health.reference_layer, 'NaN');
  assert.equal(model.reviveNonFinite('detail', 'NaN'), 'NaN');
  assert.equal(model.reviveNonFinite('flag', 'Infinity'), 'Infinity');
});

test('routeUrl is relative and escapes names', () => {
  assert.equal(model.routeUrl('runs'), 'runs');
  assert.equal(
    model.routeUrl('series', {run: 'a b', layer: 'resnet50/pool1_pool', tensor: 'activation'}),
    'series?run=a+b&layer=resnet50%2Fpool1_pool&tensor=activation',
  );
  assert.equal(model.routeUrl('step', {run: 'r&x=1', step: undefined}), 'step?run=r%26x%3D1');
});

test('the fetch functions ask for the routes the server answers, and report its errors', async () => {
  assert.deepEqual(await model.fetchRuns(recordedFetch), runs);
  const fetched = await model.fetchSeries('clean', 'pool', 'input_gradient', recordedFetch);
  assert.deepEqual(fetched, series('clean', 'pool', 'input_gradient'));
  assert.equal(fetched.role, 'input_gradient');
  assert.ok((await model.fetchRouting('clean', 'avg', recordedFetch)).tied_windows.every(Number.isNaN));
  assert.equal((await model.fetchStep('clean', undefined, recordedFetch)).step, 4);
  assert.equal((await model.fetchStep('clean', 3, recordedFetch)).step, 2);
  await assert.rejects(model.fetchStep('clean', -1, recordedFetch), (error) => {
    assert.equal(error.name, 'ApiError');
    assert.equal(error.status, 404);
    assert.match(error.message, /^step\?run=clean&step=-1: 404 .*no step <= -1$/);
    return true;
  });
});

test('visibleRuns follows the host run list, or keeps all without a host', () => {
  assert.deepEqual(runs.map(({run}) => run), ['clean', 'nan', 'relu', 'vanishing', 'weights']);
  assert.deepEqual(model.visibleRuns(runs, null), runs);
  assert.deepEqual(model.visibleRuns(runs, ['nan', 'elsewhere']).map(({run}) => run), ['nan']);
});

test('tensors group by the role the server serves', () => {
  const add = layerOf('clean', 'add');
  const groups = model.tensorsByRole(add.tensors);
  assert.deepEqual(Object.keys(groups), model.ROLES);
  assert.deepEqual(groups.activation.map(({tensor}) => tensor), ['activation']);
  assert.deepEqual(groups.input_gradient.map(({tensor, index}) => [tensor, index]),
    [['input_gradient_0', 0], ['input_gradient_1', 1]]);
  assert.deepEqual(groups.output_gradient.map(({tensor}) => tensor), ['output_gradient']);
  // /series serves the same role as /runs for every tensor.
  for (const {run, layers} of runs) {
    for (const {layer, tensors} of layers) {
      for (const {tensor, role} of tensors) assert.equal(series(run, layer, tensor).role, role);
    }
  }
});

test('latestIndexAtOrBefore finds the step the slider lands on', () => {
  const {steps} = series('clean', 'pool', 'activation');
  assert.deepEqual(steps, [2, 4]);
  assert.equal(model.latestIndexAtOrBefore(steps, 1), -1);
  assert.equal(model.latestIndexAtOrBefore(steps, 2), 0);
  assert.equal(model.latestIndexAtOrBefore(steps, 3), 0);
  assert.equal(model.latestIndexAtOrBefore(steps, 1000), 1);
  const add = layerOf('clean', 'add');
  assert.deepEqual(model.unionSteps(add.tensors.map(({tensor}) => series('clean', 'add', tensor).steps)), [2, 4]);
  assert.deepEqual(model.unionSteps([[4, 2], [2, 6]]), [2, 4, 6]);
});

test('the layer view names how many steps have full records, and the first and last', () => {
  assert.equal(model.fullRecordsLine([]), '');
  assert.equal(model.fullRecordsLine(series('clean', 'pool', 'activation').steps),
    'Full records (histograms, stats) at 2 steps, 2 to 4: the slider stops at each. A logged step '
    + 'without them has the digest only, which the flags and "Over time" read.');
  assert.ok(model.fullRecordsLine([7]).startsWith('Full records (histograms, stats) at 1 step: '));
});

test('snapshotAt takes the latest step at or before, as /step does', () => {
  const input = series('clean', 'pool', 'input_gradient');
  const snapshot = model.snapshotAt(input, 3);
  assert.equal(snapshot.step, 2);
  for (const field of model.STATS_FIELDS) assert.equal(snapshot.stats[field], input.stats[field][0]);
  assert.equal(snapshot.histogram.low, input.histogram.low[0]);
  assert.deepEqual(snapshot.histogram.counts, input.histogram.counts[0]);
  const fromStep = answer('step', {run: 'clean', step: '3'}).layers.find(({layer}) => layer === 'pool');
  assert.deepEqual(snapshot.stats, fromStep.tensors.input_gradient.stats);
  assert.deepEqual(snapshot.negative, fromStep.tensors.input_gradient.log.negative);
  assert.deepEqual(snapshot.positive, fromStep.tensors.input_gradient.log.positive);
  assert.equal(model.snapshotAt(input, 1), null);
});

test('a 2x2/2 max pool without ties leaves 75 % exact zeros in its input gradient', () => {
  const stats = model.snapshotAt(series('clean', 'pool', 'input_gradient'), 4).stats;
  assert.equal(model.zeroFraction(stats), 0.75);
  assert.equal(model.formatPercent(model.zeroFraction(stats)), '75.0 %');
  assert.equal(model.nonFiniteCount(stats), 0);
});

test('NaNs in a tensor are counted as non-finite', () => {
  // One NaN in the probe batch reaches the 3x3 neighbourhood of 4 output channels.
  const stats = model.snapshotAt(series('nan', 'conv', 'activation'), 4).stats;
  assert.equal(stats.nan, 36);
  assert.equal(model.nonFiniteCount(stats), 36);
});

test('routed fraction against the window geometry', () => {
  const pool = layerOf('clean', 'pool');
  const routing = model.routingAt(answer('routing', {run: 'clean', layer: 'pool'}), 3);
  assert.equal(routing.step, 2);
  // The server's verdict at that step, carried as it is.
  assert.equal(routing.mass.conserved, true);
  assert.deepEqual(Object.keys(routing.mass), ['difference', 'relative', 'tolerance', 'conserved']);
  assert.equal(model.routedFraction(routing), 0.25);
  assert.equal(model.predictedRoutedFraction(routing, pool.pooling), 0.25);
  assert.equal(routing.tied_windows, 0);
  assert.equal(model.windowsOverlap(pool.pooling), false);
  assert.equal(model.windowsOverlap({...pool.pooling, pool_size: [3, 3]}), true);
  const avg = layerOf('clean', 'avg');
  const spread = model.routingAt(answer('routing', {run: 'clean', layer: 'avg'}), 4);
  assert.ok(Number.isNaN(model.predictedRoutedFraction(spread, avg.pooling)));
  assert.equal(model.routedFraction(spread), 1);
});

test('magnitude bins follow the served edges, with open-ended first and last bins', () => {
  const edges = answer('step', {run: 'clean'}).log_edges;
  assert.deepEqual(series('clean', 'avg', 'activation').log.edges, edges);
  const all = model.magnitudeBins(edges);
  assert.equal(all.length, edges.length + 1);
  assert.deepEqual(all[0], {index: 0, low: 0, high: edges[0]});
  assert.equal(all[18].low, edges[17]);
  assert.equal(all[18].high, edges[18]);
  assert.equal(all[all.length - 1].high, Infinity);
  assert.equal(model.binRangeLabel(all, 1, 37), 'x ≥ 1e6');
  assert.equal(model.binRangeLabel(all, -1, 0), '−1e-12 < x < 0');
  assert.equal(model.binRangeLabel(all, 1, 17), '1e-4 ≤ x < 3.16e-4');
  assert.equal(model.binRangeLabel(all, -1, 17), '−3.16e-4 < x ≤ −1e-4');
  assert.equal(model.binRangeLabel(all, 1, 25), '1 ≤ x < 3.16');
});

test('occupied range spans every step and both signs, padded to decades', () => {
  const input = series('clean', 'pool', 'input_gradient');
  const {edges} = input.log;
  const range = model.seriesRange(input);
  const lists = [...input.log.negative, ...input.log.positive];
  lists.forEach((bins) => bins.forEach((count, j) => {
    if (count > 0) assert.ok(range.first <= j && j <= range.last, `bin ${j} outside ${JSON.stringify(range)}`);
  }));
  assert.ok(lists.some((bins) => bins[range.first] > 0) && lists.some((bins) => bins[range.last] > 0));
  const padded = model.padToDecades(range, edges);
  assert.ok(padded.first <= range.first && padded.last >= range.last);
  assert.ok(padded.first === 0 || model.isDecade(edges[padded.first - 1]));
  assert.ok(padded.last === edges.length || model.isDecade(edges[padded.last]));
  assert.equal(model.occupiedRange([lists[0].map(() => 0), null]), null);
});

test('signed bars mirror the negative bins to the left and hold every non-zero value', () => {
  const input = series('clean', 'pool', 'input_gradient');
  const range = model.seriesRange(input);
  const snapshot = model.snapshotAt(input, 4);
  const bars = model.signedBars(snapshot.negative, snapshot.positive, range);
  const width = range.last - range.first + 1;
  assert.equal(bars.length, 2 * width);
  assert.deepEqual(bars.slice(0, width).map(({sign, bin}) => [sign, bin]),
    Array.from({length: width}, (_, k) => [-1, range.last - k]));
  assert.deepEqual(bars.slice(width).map(({sign, bin}) => [sign, bin]),
    Array.from({length: width}, (_, k) => [1, range.first + k]));
  for (const {sign, bin, count} of bars) assert.equal(count, (sign < 0 ? snapshot.negative : snapshot.positive)[bin]);
  assert.equal(sum(bars.map(({count}) => count)) + snapshot.stats.zeros, snapshot.stats.count);
});

test('distribution over steps puts zeros in the middle row, as fractions of all elements', () => {
  const input = series('clean', 'pool', 'input_gradient');
  const range = model.padToDecades(model.seriesRange(input), input.log.edges);
  const grid = model.distributionOverSteps(input, range);
  assert.deepEqual(grid.steps, input.steps);
  const middle = grid.rows.findIndex(({sign}) => sign === 0);
  assert.equal(middle, range.last - range.first + 1);
  assert.equal(grid.rows.length, 2 * middle + 1);
  assert.deepEqual(grid.rows[0], {sign: 1, bin: range.last});
  assert.deepEqual(grid.rows[grid.rows.length - 1], {sign: -1, bin: range.last});
  grid.steps.forEach((_, column) => {
    assert.equal(grid.cells[middle][column], 0.75);
    const total = sum(grid.cells.map((row) => row[column]));
    assert.ok(Math.abs(total - 1) < 1e-12, `column ${column} sums to ${total}`);
  });
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
  const input = layerOf('clean', 'pool').tensors.find(({role}) => role === 'input_gradient');
  assert.equal(model.formatShape(input.shape), '8×8×8×4');
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
  const edges = answer('step', {run: 'clean'}).log_edges;
  assert.equal(model.isDecade(edges[24]), true);
  assert.equal(model.isDecade(edges[25]), false);
});

test('spacedLabels keeps pinned labels and drops the ones that would overlap', () => {
  const labels = [0, 5, 10, 15, 20, 25].map((position) => ({position, pinned: position === 15}));
  assert.deepEqual(model.spacedLabels(labels, 12).map((l) => l.position), [0, 15]);
  assert.deepEqual(model.spacedLabels(labels, 5).map((l) => l.position), [0, 5, 10, 15, 20, 25]);
  assert.deepEqual(model.spacedLabels([], 5), []);
});

test('distribution over many steps: a column per group of steps, a one-step spike kept', () => {
  const n = 1000;
  const bins = 4;
  const zeros = (length) => Array.from({length}, () => 0);
  const positive = Array.from({length: n}, () => [0, 10, 0, 0]);
  positive[538] = [0, 0, 0, 10]; // one step (539) with its values two bins up, between sampled ones
  const spiky = {steps: Array.from({length: n}, (_, i) => i + 1),
    stats: {count: Array(n).fill(10), zeros: zeros(n)},
    log: {positive, negative: Array.from({length: n}, () => zeros(bins))}};
  const grid = model.distributionOverSteps(spiky, {first: 1, last: 3}, 200);
  assert.equal(grid.steps.length, 200);
  assert.deepEqual(grid.steps.slice(0, 3), [1, 6, 11]);
  // Each column's last step is the one before the next column's first: the step axis ticks inside them.
  assert.deepEqual(grid.lastSteps.slice(0, 3), [5, 10, 15]);
  assert.equal(grid.lastSteps.at(-1), n);
  assert.equal(grid.lastStep, n);
  const top = grid.rows.findIndex(({sign, bin}) => sign === 1 && bin === 3);
  const spikeColumn = model.latestIndexAtOrBefore(grid.steps, 539);
  assert.equal(spikeColumn, 107);
  assert.deepEqual(grid.cells[top].flatMap((share, c) => (share > 0 ? [c] : [])), [107]);
  assert.equal(grid.cells[top][107], 1);
});
