// captions.js over real API answers (see api_answers.mjs): every caption is
// decided from what /runs, /routing and /step serve. Run "vanishing" has
// problems the training-health flags catch: ten sigmoid Dense layers nested in
// "body" (the first ones flagged vanishing), and "body/relu" with half its
// biases at -10 (flagged dead).

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as captions from '../../frontend/captions.js';
import * as model from '../../frontend/model.js';
import {answer, layerOf} from './api_answers.mjs';

test('the average-pool captions appear for the pooling type the server sends (issue 11, defect 1)', () => {
  const avg = layerOf('clean', 'avg');
  assert.equal(avg.pooling.type, 'average');
  assert.equal(captions.producedBy('activation', avg), 'AvgPool output (forward pass)');
  assert.equal(captions.producedBy('input_gradient', avg), 'AvgPoolGrad output (backward pass)');
  assert.equal(captions.producedBy('output_gradient', avg), 'upstream gradient, AvgPoolGrad\'s input');
  const {intro, roles} = captions.explanation(avg);
  assert.match(intro, /AvgPool forward, and AvgPoolGrad in backprop/);
  assert.deepEqual(roles.find(([title]) => title === 'Gradient w.r.t. input'),
    ['Gradient w.r.t. input', 'AvgPoolGrad\'s output, handed to the layer below.']);
  assert.equal(captions.describePooling(avg.pooling), 'average pool 2×2, stride 2×2, valid');
});

test('max-pool captions name the ops and the tie rule of the backend that wrote the run', () => {
  const pool = layerOf('clean', 'pool');
  assert.equal(pool.backend, 'tensorflow');
  assert.equal(captions.producedBy('activation', pool), 'MaxPool output (forward pass)');
  assert.equal(captions.producedBy('input_gradient', pool), 'MaxPoolGrad output (backward pass)');
  assert.equal(captions.producedBy('output_gradient', pool), 'upstream gradient, MaxPoolGrad\'s input');
  const {intro, roles} = captions.explanation(pool);
  assert.match(intro, /^Why two tensors\? In the TensorFlow graph/);
  const texts = Object.fromEntries(roles);
  assert.match(texts['Gradient w.r.t. input'], /windows with stride 2×2 do not overlap/);
  assert.match(texts.Ties, new RegExp(`this run's backend \\(tensorflow on ${pool.device}\\) sends the gradient`));
  assert.equal(captions.describePooling(pool.pooling), 'max pool 2×2, stride 2×2, valid');
  // The same layer as a JAX run would list it.
  const onJax = {...pool, backend: 'jax'};
  assert.equal(captions.producedBy('input_gradient', onJax), 'select_and_scatter_add output (backward pass)');
  assert.match(captions.explanation(onJax).intro, /On JAX, XLA runs a max pool/);
});

test('a layer that is not a pool is captioned by its class', () => {
  const conv = layerOf('clean', 'conv');
  assert.equal(conv.pooling, null);
  assert.equal(captions.producedBy('activation', conv), 'Conv2D output (forward pass)');
  assert.equal(captions.producedBy('input_gradient', conv), 'passed to the layer below (backward)');
  assert.equal(captions.producedBy('output_gradient', conv), 'upstream gradient from the layer above');
  assert.match(captions.explanation(conv).intro, /^The forward output of the layer/);
  assert.equal(captions.describePooling(conv.pooling), '');
});

test('tensor titles and sides come from the served role and index', () => {
  const add = layerOf('clean', 'add');
  assert.deepEqual(add.tensors.map((info) => captions.tensorTitle(info, add.tensors)), [
    'Activation', 'Gradient w.r.t. input 0', 'Gradient w.r.t. input 1', 'Gradient w.r.t. output']);
  assert.deepEqual(add.tensors.map(({role}) => captions.tensorSide(role)), ['output', 'input', 'input', 'output']);
  const pool = layerOf('clean', 'pool');
  assert.deepEqual(pool.tensors.map((info) => captions.tensorTitle(info, pool.tensors)), [
    'Activation', 'Gradient w.r.t. input', 'Gradient w.r.t. output']);
});

test('routing summary of a max pool: routed, predicted, ties and the served verdict', () => {
  const pool = layerOf('clean', 'pool');
  const routing = model.routingAt(answer('routing', {run: 'clean', layer: 'pool'}), 4);
  const {title, rows, verdict} = captions.routingSummary(pool, routing);
  assert.equal(title, 'Routing at step 4');
  const values = Object.fromEntries(rows);
  assert.equal(values.Routed, '25.0 % of input positions (512 of 2,048)');
  assert.equal(values.Predicted, '≤ 25.0 % = windows / input positions (512 / 2,048)');
  assert.equal(values['Tied windows'], '0 of 512');
  assert.equal(values['Σ grad input'], model.formatNumber(routing.input_gradient_sum, 6));
  assert.equal(routing.mass.conserved, true);
  assert.equal(verdict.conserved, true);
  assert.match(verdict.text, /^✓ Gradient mass conserved: the sums (are equal\.|differ by .*, rounding next to Σ\|grad\|)/);
  // The grid's cell, from the same routing as /step serves it.
  const fromStep = answer('step', {run: 'clean'}).layers.find(({layer}) => layer === 'pool').routing;
  assert.equal(captions.routingCell(fromStep, pool.pooling), '25.0 % (≤ 25.0 %)');
  assert.equal(captions.routingCell(null, null), '—');
});

test('routing summary of an average pool: every position gets a share, no bound', () => {
  const avg = layerOf('clean', 'avg');
  const routing = model.routingAt(answer('routing', {run: 'clean', layer: 'avg'}), 4);
  const values = Object.fromEntries(captions.routingSummary(avg, routing).rows);
  assert.equal(values.Predicted, 'every input position inside a window gets a share');
  assert.equal(values['Tied windows'], undefined);
  assert.equal(captions.routingCell(routing, avg.pooling), '100.0 %');
});

test('the run with problems is served with its flags, rules and reference layer', () => {
  const snapshot = answer('step', {run: 'vanishing'});
  assert.deepEqual(Object.keys(snapshot.health.rules), Object.keys(captions.FLAG_TITLES));
  assert.equal(snapshot.health.reference_layer, 'head');
  const flagged = (flag) => snapshot.layers.filter(({flags}) => flags.some((f) => f.flag === flag)).map(({layer}) => layer);
  // Vanishing: the layers nearest the input, and no layer after the first unflagged one.
  const vanishing = flagged('vanishing');
  assert.ok(vanishing.includes('body/sigmoid_0'), vanishing);
  const order = snapshot.layers.map(({layer}) => layer);
  assert.deepEqual(vanishing, order.filter((name) => name.startsWith('body/sigmoid_')).slice(0, vanishing.length));
  assert.ok(flagged('dead').includes('body/relu'));
  assert.deepEqual(flagged('nonfinite'), []);
  const conv = answer('step', {run: 'nan'}).layers.find(({layer}) => layer === 'conv');
  assert.deepEqual(conv.flags.map(({flag}) => flag), ['nonfinite']);
  assert.deepEqual(answer('step', {run: 'clean'}).layers.flatMap(({flags}) => flags), []);
});

test('a flag\'s hover text is its served rule and detail; the summary counts flagged layers', () => {
  const snapshot = answer('step', {run: 'vanishing'});
  const relu = snapshot.layers.find(({layer}) => layer === 'body/relu');
  const dead = relu.flags.find(({flag}) => flag === 'dead');
  assert.equal(captions.flagTitle(dead, snapshot.health.rules),
    `dead units: ${snapshot.health.rules.dead}\n${dead.detail}`);
  assert.match(dead.detail, /^\d+ of 8 channels never non-zero: /);
  assert.equal(captions.flagTitle({flag: 'new_flag', detail: 'd'}, {}), 'new_flag: no rule served\nd');
  const count = (flag) => snapshot.layers.filter(({flags}) => flags.some((f) => f.flag === flag)).length;
  const flagged = snapshot.layers.filter(({flags}) => flags.length).length;
  assert.equal(captions.flagSummary(snapshot), `vanishing at step 4: ${flagged} layers of ${snapshot.layers.length} `
    + `flagged (${count('vanishing')} vanishing, ${count('dead')} dead units).`);
  assert.equal(captions.flagSummary(answer('step', {run: 'clean'})), 'clean at step 4: no flag raised.');
  assert.equal(captions.flagSummary(answer('step', {run: 'nan'})),
    'nan at step 4: 1 layer of 4 flagged (1 NaN / Inf).');
});
