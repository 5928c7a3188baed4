// The weights of weights=True in model.js, captions.js and flowmodel.js, over
// real API answers (api_answers.mjs): run "weights" is a small CNN (conv with
// ReLU, bn, pool, flatten, head) logged at steps 2, 4 and 6 with every layer
// and its weights; its update records start at step 4. Run "clean" was logged
// without weights.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as captions from '../../frontend/captions.js';
import * as flowmodel from '../../frontend/flowmodel.js';
import * as model from '../../frontend/model.js';
import {answer, layerOf, recordedFetch, runs} from './api_answers.mjs';

const runEntry = (run) => runs.find((entry) => entry.run === run);
const tensorEntry = (layer, tensor) => layer.tensors.find((info) => info.tensor === tensor);
const slotsOf = (run) => flowmodel.alignLayers(runEntry(run).layers.map(({layer}) => layer), null);

test('a layer\'s weights pair each weight\'s values and gradient, in the order /runs lists them', () => {
  const conv = layerOf('weights', 'conv');
  assert.deepEqual(conv.weights, ['kernel', 'bias']);
  assert.deepEqual(model.layerWeights(conv), [
    {weight: 'kernel', values: tensorEntry(conv, 'weight/kernel'), gradient: tensorEntry(conv, 'weight_gradient/kernel'),
      updates: true},
    {weight: 'bias', values: tensorEntry(conv, 'weight/bias'), gradient: tensorEntry(conv, 'weight_gradient/bias'),
      updates: true},
  ]);
  assert.deepEqual(tensorEntry(conv, 'weight_gradient/kernel'),
    {tensor: 'weight_gradient/kernel', role: 'weight_gradient', index: 0, shape: [3, 3, 3, 4], dtype: 'float32',
      weight: 'kernel'});
  assert.deepEqual(model.layerWeights(layerOf('weights', 'bn')).map(({weight}) => weight), ['gamma', 'beta']);
  // A layer without trainable weights, a run logged without weights=True, and an older /runs without the field.
  assert.deepEqual(model.layerWeights(layerOf('weights', 'pool')), []);
  assert.deepEqual(model.layerWeights(layerOf('clean', 'conv')), []);
  assert.deepEqual(model.layerWeights({...layerOf('clean', 'conv'), weights: undefined, updates: undefined}), []);
});

test('the layer\'s own tensors leave the weights\' out; the comparison offers them after, grouped', () => {
  const conv = layerOf('weights', 'conv');
  assert.deepEqual(conv.tensors.map(({tensor}) => tensor), ['activation', 'input_gradient', 'output_gradient',
    'weight/kernel', 'weight/bias', 'weight_gradient/kernel', 'weight_gradient/bias']);
  assert.deepEqual(model.layerTensors(conv.tensors).map(({tensor}) => tensor),
    ['activation', 'input_gradient', 'output_gradient']);
  assert.deepEqual(model.comparableTensors(conv.tensors), [
    {value: 'activation'}, {value: 'input_gradient'}, {value: 'output_gradient'},
    {value: 'weight/kernel', group: 'Weights'}, {value: 'weight/bias', group: 'Weights'},
    {value: 'weight_gradient/kernel', group: 'Weights'}, {value: 'weight_gradient/bias', group: 'Weights'}]);
  const pool = layerOf('weights', 'pool');
  assert.deepEqual(model.comparableTensors(pool.tensors), pool.tensors.map(({tensor}) => ({value: tensor})));
  // The grid's columns stay the layer's three roles.
  const groups = model.tensorsByRole(conv.tensors);
  assert.deepEqual(Object.values(groups).flat().map(({tensor}) => tensor),
    ['activation', 'input_gradient', 'output_gradient']);
});

test('/updates is fetched per layer; a layer without update records is a 404', async () => {
  const updates = await model.fetchUpdates('weights', 'conv', recordedFetch);
  assert.deepEqual(updates, answer('updates', {run: 'weights', layer: 'conv'}));
  assert.deepEqual(updates.weights.map(({weight, steps, interval}) => [weight, steps, interval]),
    [['kernel', [4, 6], [2, 2]], ['bias', [4, 6], [2, 2]]]);
  await assert.rejects(model.fetchUpdates('weights', 'pool', recordedFetch), (error) => {
    assert.equal(error.status, 404);
    assert.match(error.message, /^updates\?run=weights&layer=pool: 404 .*no update records of layer 'pool'/);
    return true;
  });
  await assert.rejects(model.fetchUpdates('clean', 'conv', recordedFetch), {status: 404});
});

test('a weight\'s update at a step is its latest record at or before it, as /step serves it', () => {
  const updates = answer('updates', {run: 'weights', layer: 'bn'});
  const gamma = model.weightUpdates(updates, 'gamma');
  assert.equal(gamma, updates.weights[0]);
  assert.equal(model.weightUpdates(updates, 'kernel'), null);
  assert.equal(model.weightUpdates(null, 'gamma'), null);
  assert.equal(model.updateAt(gamma, 2), null);
  assert.equal(model.updateAt(null, 6), null);
  assert.deepEqual(model.updateAt(gamma, 5), {step: 4, weight_norm: gamma.weight_norm[0],
    update_norm: gamma.update_norm[0], update_ratio: gamma.update_ratio[0], interval: 2, size: gamma.size[0]});
  // The same numbers as /step's per-weight updates, for every weight of the run.
  const latest = answer('step', {run: 'weights'});
  assert.equal(latest.step, 6);
  for (const layer of latest.layers) {
    const entry = layerOf('weights', layer.layer);
    assert.deepEqual(Object.keys(layer.updates).sort(), [...entry.updates].sort(), layer.layer);
    if (entry.updates.length === 0) continue;
    const served = answer('updates', {run: 'weights', layer: layer.layer});
    for (const weight of entry.updates) {
      assert.deepEqual(model.updateAt(model.weightUpdates(served, weight), 6), layer.updates[weight]);
    }
  }
  // At the first log event there is no update yet.
  const first = answer('step', {run: 'weights', step: '2'});
  assert.equal(first.step, 2);
  assert.ok(first.layers.every((layer) => layer.update_ratio === null && Object.keys(layer.updates).length === 0));
});

test('the server\'s update sizes are worded; the tab decides none itself', () => {
  const served = answer('step', {run: 'weights'}).layers.filter((layer) => layer.update_ratio !== null);
  assert.ok(served.length > 0);
  for (const layer of served) {
    assert.ok(['big', 'above', 'usual', 'below', 'small', null].includes(layer.update_size));
    for (const update of Object.values(layer.updates)) assert.ok('size' in update);
  }
  assert.equal(captions.updateSize('big'), 'big jumps (≥ 10⁻¹)');
  assert.equal(captions.updateSize('usual'), 'near the usual 10⁻³');
  assert.equal(captions.updateSize('small'), 'barely moves (≤ 10⁻⁵)');
  assert.equal(captions.updateSize(null), '');
  assert.equal(typeof model.updateRatioSize, 'undefined');
  assert.match(captions.UPDATE_RATIO_NOTE, /About 10⁻³ per step is the usual healthy size; 10⁻¹ or more means big jumps; 10⁻⁵ or less/);
});

test('captions name a weight\'s tensors and word its update', () => {
  const conv = layerOf('weights', 'conv');
  const kernel = tensorEntry(conv, 'weight/kernel');
  const gradient = tensorEntry(conv, 'weight_gradient/kernel');
  assert.equal(captions.tensorTitle(kernel, conv.tensors), 'kernel (values)');
  assert.equal(captions.tensorTitle(gradient, conv.tensors), 'Gradient w.r.t. kernel');
  // The layer's own tensors keep their titles, weights or not.
  assert.deepEqual(model.layerTensors(conv.tensors).map((info) => captions.tensorTitle(info, conv.tensors)),
    ['Activation', 'Gradient w.r.t. input', 'Gradient w.r.t. output']);
  assert.equal(captions.tensorSide('weight'), 'weight');
  assert.equal(captions.tensorSide('weight_gradient'), 'weight');
  assert.equal(captions.producedBy('weight_gradient', conv), 'd loss / d weight on the probe batch (backward pass)');
  const update = {step: 6, weight_norm: 1.9906417411429236, update_norm: 0.002824362420927718,
    update_ratio: 0.0014188200531282515, interval: 2, size: 'usual'};
  assert.deepEqual(captions.updateSummary(update), {title: 'Update at step 6', ratio: '0.00142',
    size: 'near the usual 10⁻³', detail: '|Δw| 0.00282 / |w| 1.99, over 2 steps'});
  assert.equal(captions.updateSummary({...update, interval: 1}).detail, '|Δw| 0.00282 / |w| 1.99, over 1 step');
  assert.match(captions.noUpdateText(true), /second log event/);
});

test('names in /runs\' weight lists stay names, a weight called "NaN" too', () => {
  const parsed = model.parseApiJson('{"weights": ["NaN", "kernel", "Infinity"], "updates": ["NaN"], '
    + '"weight": "NaN", "weight_norm": "NaN", "update_ratio": ["Infinity", 1]}');
  assert.deepEqual(parsed.weights, ['NaN', 'kernel', 'Infinity']);
  assert.deepEqual(parsed.updates, ['NaN']);
  assert.equal(parsed.weight, 'NaN');
  assert.ok(Number.isNaN(parsed.weight_norm));
  assert.deepEqual(parsed.update_ratio, [Infinity, 1]);
  // /updates' list of weights holds objects: left as they are.
  assert.deepEqual(model.parseApiJson('{"weights": [{"weight": "b", "update_ratio": ["NaN"]}]}').weights[0].weight, 'b');
});

test('the gradient flow gets a weight-gradient panel and an update-ratio panel only for runs with them', () => {
  const weights = runEntry('weights');
  const clean = runEntry('clean');
  assert.deepEqual(flowmodel.flowRoles([weights]), ['output_gradient', 'input_gradient', 'activation', 'weight_gradient']);
  assert.deepEqual(flowmodel.flowRoles([clean]), flowmodel.FLOW_ROLES);
  assert.deepEqual(flowmodel.flowRoles([clean, weights]), flowmodel.flowRoles([weights]));
  assert.deepEqual(flowmodel.flowRoles([clean, undefined]), flowmodel.FLOW_ROLES);
  assert.equal(flowmodel.hasUpdates([weights]), true);
  assert.equal(flowmodel.hasUpdates([clean, weights]), true);
  assert.equal(flowmodel.hasUpdates([clean]), false);
});

test('the flow\'s weight-gradient RMS and update ratio per layer are /step\'s, null where a layer has none', () => {
  const snapshot = answer('step', {run: 'weights'});
  const slots = slotsOf('weights');
  assert.deepEqual(slots.map(({primary}) => primary), ['conv', 'bn', 'pool', 'flatten', 'head']);
  const line = flowmodel.flowLine(snapshot, slots, 'primary', flowmodel.flowRoles([runEntry('weights')]));
  const byName = Object.fromEntries(snapshot.layers.map((layer) => [layer.layer, layer]));
  assert.deepEqual(line.weight_gradient.rms, [byName.conv.flow.weight_gradient.rms, byName.bn.flow.weight_gradient.rms,
    null, null, byName.head.flow.weight_gradient.rms]);
  assert.ok(line.weight_gradient.rms.every((value) => value === null || value > 0));
  // Without roles, the three of every layer, as before weights.
  assert.deepEqual(Object.keys(flowmodel.flowLine(snapshot, slots, 'primary')), flowmodel.FLOW_ROLES);
  const ratios = flowmodel.updateRatioLine(snapshot, slots, 'primary');
  assert.deepEqual(ratios, [byName.conv.update_ratio, byName.bn.update_ratio, null, null, byName.head.update_ratio]);
  assert.ok([0, 1, 4].every((k) => ratios[k] > 0 && Number.isFinite(ratios[k])), ratios);
  assert.deepEqual(flowmodel.updateRatioLine(answer('step', {run: 'weights', step: '2'}), slots, 'primary'),
    [null, null, null, null, null]);
  // The axis always holds the 1e-3 guide.
  const range = flowmodel.updateRatioRange([ratios]);
  assert.equal(range.low, Math.min(-3, Math.floor(Math.log10(Math.min(...ratios.filter(Boolean))))));
  assert.equal(range.high, Math.max(-2, Math.ceil(Math.log10(Math.max(...ratios.filter(Boolean))))));
  assert.deepEqual(flowmodel.updateRatioRange([[null, NaN, 0]]), {low: -3, high: -2});
  assert.deepEqual(flowmodel.updateRatioRange([[0.37, 0.012]]), {low: -3, high: 0});
  assert.deepEqual(flowmodel.updateRatioRange([[2e-7], [null]]), {low: -7, high: -3});
});
