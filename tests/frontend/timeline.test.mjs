// timelinemodel.js over real /timeline answers (api_answers.mjs): the flags of
// each layer at the last column are the flags /step gives it at the last step.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as timelinemodel from '../../frontend/timelinemodel.js';
import {answer, runs} from './api_answers.mjs';

// The flags the timeline decides (/step may raise others, which it does not draw).
const flagsOf = (snapshot) => snapshot.flags.map(({flag}) => flag).filter((flag) => timelinemodel.FLAGS.includes(flag)).sort();

test('each layer, in model order, has the flags at the last column that /step raises at the last step', () => {
  for (const {run, layers} of runs) {
    const body = answer('timeline', {run});
    const matrix = timelinemodel.timelineMatrix(body);
    assert.deepEqual(matrix.rows.map((row) => row.layer), layers.map(({layer}) => layer), run);
    const last = matrix.columns.first_step.length - 1;
    assert.equal(matrix.columns.last_step[last], answer('step', {run}).step);
    const step = new Map(answer('step', {run}).layers.map((snapshot) => [snapshot.layer, flagsOf(snapshot)]));
    for (const row of matrix.rows) {
      assert.deepEqual([...row.flags[last]].sort(), step.get(row.layer), `${run} ${row.layer}`);
    }
  }
  // The runs are chosen so that these flags are raised at all.
  const vanishing = timelinemodel.timelineMatrix(answer('timeline', {run: 'vanishing'}));
  assert.ok(vanishing.rows.some((row) => row.flags.at(-1).includes('vanishing')));
  assert.ok(vanishing.rows.some((row) => row.flags.at(-1).includes('dead')));
  const nan = timelinemodel.timelineMatrix(answer('timeline', {run: 'nan'}));
  assert.ok(nan.rows.some((row) => row.flags.at(-1).includes('nonfinite')));
});

test('cells show log10 of the column maximum, and the range spans them', () => {
  const body = answer('timeline', {run: 'clean'});
  const matrix = timelinemodel.timelineMatrix(body);
  const first = body.layers[0];
  assert.equal(matrix.rows[0].values[0], Math.log10(first.rms.max[0]));
  const values = matrix.rows.flatMap((row) => row.values).filter((v) => v !== null);
  assert.equal(matrix.low, Math.min(...values));
  assert.equal(matrix.high, Math.max(...values));
  assert.equal(matrix.diverging, false);
  // Update ratios of the weights run: the first log event has none (no value), the next has.
  const weights = timelinemodel.timelineMatrix(answer('timeline', {run: 'weights', field: 'update_ratio', role: 'weight'}));
  const conv = weights.rows.find((row) => row.layer === 'conv');
  assert.equal(conv.values[0], null);
  assert.ok(Number.isFinite(conv.values.at(-1)));
});

test('a run against itself differs by zero, against another where both have values', () => {
  const clean = timelinemodel.timelineMatrix(answer('timeline', {run: 'clean'}));
  const nan = timelinemodel.timelineMatrix(answer('timeline', {run: 'nan'}));
  const same = timelinemodel.differenceMatrix(clean, clean);
  assert.ok(same.diverging && same.low === -same.high);
  assert.ok(same.rows.every((row) => row.values.every((v) => v === null || v === 0)));
  const other = timelinemodel.differenceMatrix(clean, nan);
  assert.deepEqual(other.rows.map((row) => row.layer), clean.rows.map((row) => row.layer));
  assert.equal(other.rows[0].values[0], clean.rows[0].values[0] - nan.rows[0].values[0]);
});

test('minus a run that shares no layer says so instead of throwing', () => {
  const clean = answer('timeline', {run: 'clean'});
  const vanishing = answer('timeline', {run: 'vanishing'});
  assert.deepEqual(vanishing.layers.filter(({layer}) => clean.layers.some((c) => c.layer === layer)), []);
  assert.deepEqual(timelinemodel.timelineView(clean, vanishing), {matrix: null, status:
    'No shared layers between run clean and run vanishing: nothing to subtract. '
    + 'Choose another run under "Minus run", or (none).'});
  // Runs with the same layers: the difference, and the line above it.
  const nan = answer('timeline', {run: 'nan'});
  const {matrix, status} = timelinemodel.timelineView(clean, nan);
  assert.deepEqual(matrix, timelinemodel.differenceMatrix(timelinemodel.timelineMatrix(clean),
    timelinemodel.timelineMatrix(nan)));
  assert.equal(status, `4 layers, ${clean.steps} logged steps, minus nan.`);
  assert.deepEqual(timelinemodel.timelineView(clean),
    {matrix: timelinemodel.timelineMatrix(clean), status: `4 layers, ${clean.steps} logged steps.`});
});

test('the column holding a step, the cell under a point, and what hovering it says', () => {
  const columns = {first_step: [1, 13, 25], last_step: [12, 24, 30]};
  assert.equal(timelinemodel.columnHolding(columns, 0), null);
  assert.equal(timelinemodel.columnHolding(columns, 1), 0);
  assert.equal(timelinemodel.columnHolding(columns, 24), 1);
  assert.equal(timelinemodel.columnHolding(columns, 30), 2);
  assert.equal(timelinemodel.columnHolding(columns, 31), null);
  const matrix = {field: 'rms', diverging: false, columns, rows: [
    {layer: 'a', values: [0, -1, null], flags: [[], ['vanishing'], []], envelope: {min: [1, 0.05, null], max: [1, 0.1, null]}},
    {layer: 'b', values: [0, 0, 0], flags: [[], [], []], envelope: {min: [1, 1, 1], max: [1, 1, 1]}},
  ]};
  assert.deepEqual(timelinemodel.cellAt(matrix, 300, 20, 150, 5), {row: 0, column: 1});
  assert.deepEqual(timelinemodel.cellAt(matrix, 300, 20, 299.9, 19.9), {row: 1, column: 2});
  assert.equal(timelinemodel.cellAt(matrix, 300, 20, 300, 5), null);
  assert.equal(timelinemodel.describeCell(matrix, {row: 0, column: 1}),
    'a, steps 13-24: rms 0.0500 to 0.100; flags: vanishing');
  assert.equal(timelinemodel.describeCell(matrix, {row: 0, column: 2}), 'a, steps 25-30: no value');
  assert.equal(timelinemodel.describeCell(matrix, {row: 1, column: 0}), 'b, steps 1-12: rms 1.00');
});

test('the cost budget in words; nothing without one', () => {
  assert.equal(timelinemodel.budgetText(null), '');
  assert.equal(timelinemodel.budgetText({budget: 0.02, asked_interval: 1, interval: 12, share: 0.0191, step: 300,
    log_seconds: 1, train_seconds: 50}),
  ' Logging budget 2.0 %: every 12 (asked: every 1); logging took 1.9 % of training time, at step 300.');
  // Every answer of the fixtures' runs (logged without a budget) says none.
  assert.equal(answer('timeline', {run: 'clean'}).budget, null);
});

test('colours run from the ramp\'s first stop to its last; a difference is white at zero', () => {
  assert.deepEqual(timelinemodel.colourOf(0, 0, 1, false), [68, 1, 84]);
  assert.deepEqual(timelinemodel.colourOf(1, 0, 1, false), [253, 231, 37]);
  assert.deepEqual(timelinemodel.colourOf(5, 0, 1, false), [253, 231, 37]);
  assert.deepEqual(timelinemodel.colourOf(0, -1, 1, true), [247, 247, 247]);
  assert.equal(timelinemodel.colourOf(null, 0, 1, false), null);
});

test('the flush share of each layer at the last column is the one /step sends at the last step', () => {
  const body = answer('timeline', {run: 'clean', field: 'flush_share'});
  const matrix = timelinemodel.timelineMatrix(body);
  const latest = answer('step', {run: 'clean'});
  assert.equal(body.columns.last_step.at(-1), latest.step);
  assert.deepEqual(matrix.rows.map((row) => row.layer), latest.layers.map((layer) => layer.layer));
  for (const row of matrix.rows) {
    const sent = latest.layers.find((entry) => entry.layer === row.layer).flush_share.output_gradient;
    assert.equal(row.format, sent.format);
    assert.equal(row.envelope.max.at(-1), sent.share, row.layer);
    assert.equal(row.values.at(-1), sent.share); // a plain fraction, not a log
  }
  assert.match(timelinemodel.describeCell(matrix, {row: 0, column: 0}),
    /^conv, step \d+: flush_share in float16 \d/);
});

test('the view asks for a multiple of WIDTH_STEP columns, never more than its pixels', () => {
  const {columnsFor, WIDTH_STEP} = timelinemodel;
  assert.equal(WIDTH_STEP, 50);
  // A layout that settles by a few pixels asks for the same width.
  assert.deepEqual([1203, 1210, 1249.9, 1250].map(columnsFor), [1200, 1200, 1200, 1250]);
  // Below one step the drawing's own width; nothing to draw is 0.
  assert.deepEqual([49.7, 1, 0.4, 0, -5, NaN].map(columnsFor), [49, 1, 0, 0, 0, 0]);
});
