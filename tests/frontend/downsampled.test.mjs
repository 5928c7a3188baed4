// A /series downsampled by the server (past `width` steps): the tab draws its
// columns and fetches the record of the step it shows. Real answers: the
// "clean" run's max pool (steps 2 and 4) in one column (width=1).

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as model from '../../frontend/model.js';
import {recordedFetch, series} from './api_answers.mjs';

const POOL = ['clean', 'pool', 'input_gradient'];

test('a downsampled series is fetched with its width and keeps each column\'s extremes', async () => {
  const full = series(...POOL);
  const down = await model.fetchSeries(...POOL, recordedFetch, {width: 1});
  assert.equal(down.downsampled, true);
  assert.equal(full.downsampled, false);
  assert.deepEqual(down.steps, full.steps);
  assert.deepEqual(down.columns, {first_step: [2], last_step: [4]});
  for (const field of ['min', 'max', 'std']) {
    const over = model.fieldOverSteps(down, field);
    const values = full.stats[field];
    assert.deepEqual([over.low[0], over.high[0]], [Math.min(values[0], values[1]), Math.max(values[0], values[1])]);
    assert.deepEqual(model.fieldOverSteps(full, field).low, values);
  }
  // Each magnitude bin's largest count over the column's steps.
  full.log.positive[0].forEach((count, bin) =>
    assert.equal(down.log.positive[0][bin], Math.max(count, full.log.positive[1][bin])));
});

test('the distribution over steps of a downsampled series: one cell per column, zeros in the middle', async () => {
  const down = await model.fetchSeries(...POOL, recordedFetch, {width: 1});
  const range = model.padToDecades(model.seriesRange(down), down.log.edges);
  const grid = model.distributionOverSteps(down, range);
  assert.deepEqual(grid.steps, [2]);
  assert.deepEqual(grid.lastSteps, [4]);
  assert.equal(grid.lastStep, 4);
  const middle = grid.rows.findIndex(({sign}) => sign === 0);
  assert.equal(grid.cells[middle][0], 0.75); // a 2x2/2 max pool routes a quarter of the positions
});

test('the panels of a downsampled series wait for the record of their step, then show it exactly', async () => {
  const full = series(...POOL);
  const down = await model.fetchSeries(...POOL, recordedFetch, {width: 1});
  assert.deepEqual(model.snapshotAt(down, 5), {step: 4, pending: true});
  assert.equal(model.snapshotAt(down, 1), null);
  await model.loadRecord(down, 5, recordedFetch);
  assert.deepEqual(model.snapshotAt(down, 5), model.snapshotAt(full, 5));
  // Step 3 falls on step 2, not loaded yet.
  assert.deepEqual(model.snapshotAt(down, 3), {step: 2, pending: true});
  await model.loadRecord(down, 3, recordedFetch);
  assert.deepEqual(model.snapshotAt(down, 3), model.snapshotAt(full, 2));
  assert.equal(await model.loadRecord(full, 4, recordedFetch), null);
});

test('columnExtremes groups steps as the server does and keeps a one-step jump', () => {
  const values = Array.from({length: 10}, (_, i) => (i === 6 ? 5 : 1e-3 * (i + 1)));
  values[2] = 0; // left out by `keep`, as a weight that did not move is on a log axis
  const {starts, low, high} = model.columnExtremes(values, 4, (value) => value > 0);
  assert.deepEqual(starts, [0, 2, 5, 7]); // series.column_starts(10, 4)
  assert.deepEqual(low, [1e-3, 4e-3, 6e-3, 8e-3]);
  assert.deepEqual(high, [2e-3, 5e-3, 5, 1e-2]);
  assert.deepEqual(model.columnExtremes([0, 0], 4, (value) => value > 0), {starts: [0, 1], low: [NaN, NaN], high: [NaN, NaN]});
});
