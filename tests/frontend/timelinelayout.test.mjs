// The depth x time view's geometry (timelinelayout.js) and the round ticks it takes from
// format.js: row heights and which rows are named, where a step lies, the step axis' ticks,
// the steps a drag picks, the colour bar's title and ticks.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {niceTicks} from '../../frontend/format.js';
import * as layout from '../../frontend/timelinelayout.js';
import * as timelinemodel from '../../frontend/timelinemodel.js';

// Columns of one logged step each, steps first..last.
const oneStepColumns = (first, last) => {
  const steps = Array.from({length: last - first + 1}, (_, i) => first + i);
  return {first_step: steps, last_step: steps};
};

test('round ticks: 1, 2 or 5 times a power of ten apart, inside the range, whole for steps', () => {
  assert.deepEqual(niceTicks(1, 300, 12, {integer: true}), [50, 100, 150, 200, 250, 300]);
  assert.deepEqual(niceTicks(100, 150, 12, {integer: true}), [100, 105, 110, 115, 120, 125, 130, 135, 140, 145, 150]);
  assert.deepEqual(niceTicks(5, 8, 10, {integer: true}), [5, 6, 7, 8]);
  assert.deepEqual(niceTicks(-5.3, -2.1, 4), [-5, -4, -3]);
  assert.deepEqual(niceTicks(0, 0.8, 4), [0, 0.2, 0.4, 0.6, 0.8]);
  assert.deepEqual(niceTicks(0.0012, 0.0031, 4), [0.0015, 0.002, 0.0025, 0.003]);
  assert.deepEqual(niceTicks(7, 7), [7]);
  assert.deepEqual(niceTicks(NaN, 1), []);
});

test('rows fill the view up to its height, every one named, then scroll by whole rows', () => {
  assert.deepEqual(layout.rowLayout(8), {rowHeight: 24, height: 192, viewport: 192, labelEvery: 1});
  assert.deepEqual(layout.rowLayout(12), {rowHeight: 24, height: 288, viewport: 288, labelEvery: 1});
  assert.deepEqual(layout.rowLayout(23), {rowHeight: 20, height: 460, viewport: 460, labelEvery: 1});
  assert.deepEqual(layout.rowLayout(40), {rowHeight: 12, height: 480, viewport: 480, labelEvery: 1});
  // Past 40 layers the rows stay tall enough for their names and scroll; the view shows whole rows.
  assert.deepEqual(layout.rowLayout(41), {rowHeight: 12, height: 492, viewport: 480, labelEvery: 1});
  assert.deepEqual(layout.rowLayout(63), {rowHeight: 12, height: 756, viewport: 480, labelEvery: 1});
  assert.deepEqual(layout.rowLayout(500), {rowHeight: 12, height: 6000, viewport: 480, labelEvery: 1});
  // Past ALL_NAMED_UP_TO layers (a canvas too large otherwise), every other row is named.
  assert.deepEqual(layout.rowLayout(501), {rowHeight: 8, height: 4008, viewport: 480, labelEvery: 2});
  assert.equal(layout.rowLayout(0).rowHeight, 24);
});

test('the note under rows that scroll says which rows are shown whole', () => {
  const rows = layout.rowLayout(63);
  assert.deepEqual(layout.rowsShown(rows, 63, 0), {first: 1, last: 40});
  assert.deepEqual(layout.rowsShown(rows, 63, 6), {first: 2, last: 40});
  assert.deepEqual(layout.rowsShown(rows, 63, 12), {first: 2, last: 41});
  assert.deepEqual(layout.rowsShown(rows, 63, 756 - 480), {first: 24, last: 63});
});

test('a step lies in the middle of its own column, in proportion inside a wider one, and between two', () => {
  const single = oneStepColumns(1, 300);
  assert.equal(layout.stepPosition(single, 1), 0.5 / 300);
  assert.equal(layout.stepPosition(single, 120), 119.5 / 300);
  // Three columns of 10 steps (1-10, 11-20, 21-30).
  const wide = {first_step: [1, 11, 21], last_step: [10, 20, 30]};
  assert.equal(layout.stepPosition(wide, 1), 0.5 / 30);
  assert.equal(layout.stepPosition(wide, 15), (1 + 4.5 / 10) / 3);
  // Logged every 10 steps: step 15 lies halfway between steps 10 and 20.
  const sparse = {first_step: [10, 20, 30], last_step: [10, 20, 30]};
  assert.ok(Math.abs(layout.stepPosition(sparse, 15) - (0.5 + 1.5) / 2 / 3) < 1e-12);
  // Outside the columns: at the end's step.
  assert.equal(layout.stepPosition(sparse, 0), 0.5 / 3);
  assert.equal(layout.stepPosition(sparse, 99), 2.5 / 3);
});

test('step ticks are round steps under their columns, never closer than a label', () => {
  const ticks = layout.stepTicks(oneStepColumns(1, 300), 1200);
  assert.deepEqual(ticks.map(({step}) => step), [50, 100, 150, 200, 250, 300]);
  for (const {step, x} of ticks) assert.equal(x, ((step - 0.5) / 300) * 1200);
  const zoomed = layout.stepTicks(oneStepColumns(100, 150), 1200);
  assert.deepEqual(zoomed.map(({step}) => step), [100, 105, 110, 115, 120, 125, 130, 135, 140, 145, 150]);
  // Logged steps 1..10 then 1000: the axis is by column, and labels that would overlap are left out.
  const uneven = {first_step: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000], last_step: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000]};
  const placed = layout.stepTicks(uneven, 400);
  for (let i = 1; i < placed.length; i++) assert.ok(placed[i].x - placed[i - 1].x >= 64, JSON.stringify(placed));
  assert.deepEqual(layout.stepTicks({first_step: [], last_step: []}, 400), []);
});

test('step ticks name only steps a column holds: logged steps where round ones were not logged', () => {
  // Three logged steps, 4, 8 and 12, one column each: never 5, 6, 7, 9, 10 or 11.
  const three = {first_step: [4, 8, 12], last_step: [4, 8, 12]};
  assert.deepEqual(layout.stepTicks(three, 1100).map(({step}) => step), [4, 8, 12]);
  for (const {step, x} of layout.stepTicks(three, 1100)) assert.equal(x, layout.stepPosition(three, step) * 1100);
  // Logged every 10 steps from step 1: the round steps were never logged, the nearest logged ones are named.
  const steps = Array.from({length: 100}, (_, i) => 1 + 10 * i);
  const sparse = {first_step: steps, last_step: steps};
  const named = layout.stepTicks(sparse, 1200).map(({step}) => step);
  assert.ok(named.length >= 4, JSON.stringify(named));
  for (const step of named) assert.ok(steps.includes(step), step);
  // Columns of several steps hold every step they span: round steps are named there.
  const wide = {first_step: [1, 11, 21, 31], last_step: [10, 20, 30, 40]};
  assert.deepEqual(layout.stepTicks(wide, 400).map(({step}) => step), [10, 20, 30, 40]);
});

test('a drag picks the first step of its left column to the last of its right, either way', () => {
  const columns = {first_step: [1, 11, 21, 31], last_step: [10, 20, 30, 40]};
  assert.deepEqual(layout.dragRange(columns, 400, 150, 250), {start: 11, end: 30});
  assert.deepEqual(layout.dragRange(columns, 400, 250, 150), {start: 11, end: 30});
  assert.deepEqual(layout.dragRange(columns, 400, -20, 900), {start: 1, end: 40});
  assert.deepEqual(layout.dragRange(oneStepColumns(1, 300), 1200, ((100 - 0.5) / 300) * 1200, ((150 - 0.5) / 300) * 1200),
    {start: 100, end: 150});
});

test('the colour bar names the field, its tensors and its scale, with ticks in its units', () => {
  assert.equal(layout.colourTitle('rms', 'output_gradient', false), 'RMS of the output gradient, log scale');
  assert.equal(layout.colourTitle('zero_share', 'activation', false), 'Share of exact zeros of the activation, 0 to 100 %');
  assert.equal(layout.colourTitle('update_ratio', 'weight', false), 'Update ratio of the weights, log scale');
  assert.equal(layout.colourTitle('rms', 'input_gradient', true),
    'RMS of the input gradient: run A − run B, in decades (log10)');
  assert.deepEqual(layout.colourTicks('rms', -5.3, -2.1, false),
    [{value: -5, label: '10⁻⁵'}, {value: -4, label: '10⁻⁴'}, {value: -3, label: '10⁻³'}]);
  assert.deepEqual(layout.colourTicks('zero_share', 0, 0.5, false).map(({label}) => label),
    ['0 %', '20 %', '40 %']);
  assert.deepEqual(layout.colourTicks('rms', -1.2, 1.2, true).map(({label}) => label), ['−1', '0', '+1']);
});

test('a body of a step range says the steps it shows and the way back', () => {
  const body = {run: 'r', field: 'rms', steps: 3, start: 10, end: 12,
    columns: {first_step: [10, 11, 12], last_step: [10, 11, 12]},
    layers: [{layer: 'a', rms: {min: [1, 1, 1], max: [1, 1, 1]}, flags: {}}]};
  assert.equal(timelinemodel.timelineView(body).status,
    '1 layers, 3 logged steps from step 10 to 12. Zoomed in: "Whole run" or Escape goes back.');
  assert.equal(timelinemodel.timelineView({...body, start: null, end: null}).status, '1 layers, 3 logged steps.');
});

test('a body read from the digest\'s level says how many events a point pools', () => {
  const body = {run: 'r', field: 'rms', steps: 48, start: null, end: null, level: 16,
    columns: {first_step: [1, 17], last_step: [16, 48]},
    layers: [{layer: 'a', rms: {min: [1, 1], max: [1, 2]}, flags: {}}]};
  assert.equal(timelinemodel.timelineView(body).status,
    '1 layers, 48 logged steps in 2 columns (read from the digest\'s level of 16 events pooled a point).');
  assert.equal(timelinemodel.timelineView({...body, level: 1}).status, '1 layers, 48 logged steps in 2 columns.');
});
