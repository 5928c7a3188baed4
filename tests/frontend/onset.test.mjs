// onset.js: the "where each flag began" table's rows and line, from real /onset answers.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {answer, recordedFetch} from './api_answers.mjs';
import * as onset from '../../frontend/onset.js';

test('a run with flags has one row per onset: flag, first step, first layer, tensor, persistence', () => {
  const body = answer('onset', {run: 'nan'});
  assert.ok(body.onsets.length > 0, JSON.stringify(body));
  const rows = onset.onsetRows(body);
  assert.deepEqual(rows.map(({flag}) => flag), body.onsets.map(({flag}) => flag));
  const nonfinite = rows.find(({flag}) => flag === 'nonfinite');
  const served = body.onsets.find(({flag}) => flag === 'nonfinite');
  assert.equal(nonfinite.title, 'NaN / Inf');
  assert.deepEqual([nonfinite.step, nonfinite.layer, nonfinite.tensor], [served.step, served.layer, served.tensor]);
  assert.equal(nonfinite.persists, served.persists
    ? `yes, through step ${body.last_step}`
    : `no: raised at ${served.raised_steps} of ${body.steps} steps, last at step ${served.last_raised_step}`);
  assert.match(onset.onsetSummary(body), /^nan: \d+ flags? raised in \d+ logged steps \(steps \d+ to \d+\)\. Where each began:$/);
});

test('a run without flags says so in one line', () => {
  const body = answer('onset', {run: 'clean'});
  assert.deepEqual(body.onsets, []);
  assert.deepEqual(onset.onsetRows(body), []);
  assert.equal(onset.onsetSummary(body),
    `clean: no flag was raised at any of its ${body.steps} logged steps (steps ${body.first_step} to ${body.last_step}).`);
});

test('a persisting and a passing onset read differently', () => {
  const body = {run: 'r', steps: 8, first_step: 1, last_step: 8, onsets: [
    {flag: 'vanishing', step: 5, layer: 'd1', tensor: 'output_gradient', persists: true, raised_steps: 4,
      last_raised_step: 8, detail: ''},
    {flag: 'dead', step: 2, layer: 'd2', tensor: 'activation', persists: false, raised_steps: 1,
      last_raised_step: 2, detail: ''}]};
  assert.deepEqual(onset.onsetRows(body).map(({persists}) => persists),
    ['yes, through step 8', 'no: raised at 1 of 8 steps, last at step 2']);
});

test('warnings are rows of their own class, counted apart in the line', () => {
  const body = {run: 'r', steps: 8, first_step: 1, last_step: 8, onsets: [
    {flag: 'nonfinite', class: 'flag', step: 7, layer: 'd1', tensor: 'activation', persists: true,
      raised_steps: 2, last_raised_step: 8, detail: ''},
    {flag: 'rms_growth', class: 'warning', step: 5, layer: 'd1', tensor: 'activation', persists: false,
      raised_steps: 1, last_raised_step: 5, detail: 'RMS 5, 5x its median 1 over steps 1-4',
      remedy: 'The first layer\'s output grows: its input may have drifted; check the input pipeline.'}]};
  const rows = onset.onsetRows(body);
  assert.deepEqual(rows.map(({kind, title}) => [kind, title]), [['flag', 'NaN / Inf'], ['warning', 'RMS growth']]);
  // The warning's row says what to try; the flag's has nothing there.
  assert.deepEqual(rows.map(({remedy}) => remedy), ['', body.onsets[1].remedy]);
  assert.equal(onset.onsetSummary(body), 'r: 1 flag and 1 warning raised in 8 logged steps (steps 1 to 8). Where each began:');
  assert.equal(onset.onsetSummary({...body, onsets: body.onsets.slice(1)}),
    'r: 1 warning raised in 8 logged steps (steps 1 to 8). Where each began:');
});

test('fetchOnset asks /onset for the run', async () => {
  assert.deepEqual(await onset.fetchOnset('nan', recordedFetch), answer('onset', {run: 'nan'}));
});
