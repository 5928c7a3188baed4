// flowmodel.js over real API answers (api_answers.mjs):
// runs "clean" and "nan" (conv, pool, avg, add) and "vanishing", every layer
// logged: ten sigmoid Dense layers nested in "body" (the first ones flagged
// vanishing) and "body/relu" with half its biases at -10 (flagged dead).

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as flowmodel from '../../frontend/flowmodel.js';
import {answer, runs} from './api_answers.mjs';

const layerNames = (run) => runs.find((entry) => entry.run === run).layers.map(({layer}) => layer);
const latest = (run) => answer('step', {run});

// The 177 layer paths of keras.applications.ResNet50 nested in a Sequential, as
// /runs lists them with every layer chosen (the container first), abridged to a
// block of each kind: what matters is their shape.
const RESNET_NAMES = ['resnet50', 'resnet50/conv1_pad', 'resnet50/conv1_conv', 'resnet50/pool1_pool',
  'resnet50/conv2_block1_1_conv', 'resnet50/conv2_block1_out', 'resnet50/conv5_block3_3_bn', 'resnet50/avg_pool',
  'resnet50/predictions'];

test('short layer names drop the shared path and keep the end of long ones', () => {
  assert.deepEqual(flowmodel.shortLayerNames(RESNET_NAMES), ['resnet50', 'conv1_pad', 'conv1_conv', 'pool1_pool',
    'conv2_block1_1_conv', 'conv2_block1_out', 'conv5_block3_3_bn', 'avg_pool', 'predictions']);
  // The real nested run: "body" and "head" share nothing, and the paths are short enough to keep.
  const names = layerNames('vanishing');
  assert.deepEqual(flowmodel.shortLayerNames(names), names);
  assert.deepEqual(flowmodel.shortLayerNames(names.filter((name) => name.startsWith('body/'))),
    names.filter((name) => name.startsWith('body/')).map((name) => name.slice('body/'.length)));
  // Too long: the last components, as many as tell the names apart, cut in the middle if still too long.
  assert.deepEqual(flowmodel.shortLayerNames(['model/encoder/block_1/attention', 'model/decoder/block_1/attention',
    'model/decoder/block_2/attention', 'model/decoder/head'], 17),
  ['encoder/…ttention', 'decoder/…ttention', 'block_2/attention', 'decoder/head']);
  assert.deepEqual(flowmodel.shortLayerNames(['a/x', 'b/very_long_layer_name_indeed'], 12), ['a/x', 'very_…indeed']);
  assert.equal(flowmodel.middleEllipsis('abcdefghij', 5), 'ab…ij');
  assert.deepEqual(flowmodel.shortLayerNames(['only/one']), ['one']);
  assert.deepEqual(flowmodel.shortLayerNames([]), []);
});

test('two runs share the slots of the layers they share, the others go between by depth', () => {
  const names = layerNames('clean');
  assert.deepEqual(flowmodel.alignLayers(names, null), names.map((name) => ({primary: name, other: null})));
  assert.deepEqual(flowmodel.alignLayers(names, layerNames('nan')), names.map((name) => ({primary: name, other: name})));
  // One run has a layer more (a BatchNorm after the convolution, say), and lacks one.
  const other = ['conv', 'conv_bn', 'pool', 'add'];
  assert.deepEqual(flowmodel.alignLayers(names, other), [
    {primary: 'conv', other: 'conv'}, {primary: null, other: 'conv_bn'}, {primary: 'pool', other: 'pool'},
    {primary: 'avg', other: null}, {primary: 'add', other: 'add'}]);
  // Nothing in common: both runs spread over the axis, each in its own order.
  const slots = flowmodel.alignLayers(names, layerNames('vanishing'));
  assert.equal(slots.length, names.length + layerNames('vanishing').length);
  assert.deepEqual(slots.filter(({primary}) => primary).map(({primary}) => primary), names);
  assert.deepEqual(slots.filter(({other}) => other).map(({other}) => other), layerNames('vanishing'));
  assert.ok(slots.every(({primary, other}) => (primary === null) !== (other === null)));
  assert.equal(slots[slots.length - 1].other, 'head');
  // 13 layers against 4: the first two of the longer run come before the first of the other.
  assert.deepEqual(slots.map(flowmodel.slotName).slice(0, 4), ['body', 'body/sigmoid_0', 'conv', 'body/sigmoid_1']);
});

test('a line holds each layer\'s served flow values, null where the run lacks the layer', () => {
  const snapshot = latest('vanishing');
  const slots = flowmodel.alignLayers(layerNames('clean'), layerNames('vanishing'));
  const line = flowmodel.flowLine(snapshot, slots, 'other');
  assert.deepEqual(Object.keys(line), flowmodel.FLOW_ROLES);
  slots.forEach((slot, k) => {
    const layer = snapshot.layers.find(({layer: name}) => name === slot.other);
    for (const role of flowmodel.FLOW_ROLES) {
      for (const stat of ['rms', 'max_abs', 'zero_fraction']) {
        assert.equal(line[role][stat][k], layer ? layer.flow[role][stat] : null, `${slot.other} ${role} ${stat}`);
      }
    }
  });
  // The output gradient's RMS falls by orders of magnitude toward the input.
  const rms = flowmodel.flowLine(snapshot, flowmodel.alignLayers(layerNames('vanishing'), null), 'primary')
    .output_gradient.rms;
  const head = rms[rms.length - 1];
  assert.ok(rms[1] * 1000 < head, `${rms[1]} vs ${head}`);
  const flags = flowmodel.slotFlags(snapshot, slots, 'other');
  assert.deepEqual(flags.map((list, k) => (slots[k].other ? list : null)),
    slots.map(({other}) => (other ? snapshot.layers.find(({layer}) => layer === other).flags : null)));
  assert.deepEqual(flowmodel.slotFlags(snapshot, slots, 'primary'), slots.map(() => []));
});

test('log ranges span whole decades of the finite positive values; zeros, NaN and gaps are left out', () => {
  const lines = ['clean', 'nan', 'vanishing'].map((run) => {
    const slots = flowmodel.alignLayers(layerNames(run), null);
    return flowmodel.flowLine(latest(run), slots, 'primary');
  });
  for (const line of lines) {
    for (const role of flowmodel.FLOW_ROLES) {
      const lists = flowmodel.LOG_STATS.map((stat) => line[role][stat]);
      const range = flowmodel.logRange(lists);
      for (const value of lists.flat()) {
        const position = flowmodel.logPosition(value, range);
        assert.ok(position >= 0 && position <= 1, `${value} outside 1e${range.low}..1e${range.high}`);
      }
      const values = lists.flat();
      assert.equal(range.low, Math.floor(Math.log10(Math.min(...values))));
      // With a zero, a NaN and a missing layer added, the range is the same.
      assert.deepEqual(flowmodel.logRange([...lists, [0, NaN, null, Infinity]]), range);
    }
  }
  // The NaN probe's pool holds float32's largest magnitude: the axis reaches 10^39.
  assert.equal(flowmodel.logRange([lines[1].activation.max_abs]).high, 39);
  assert.deepEqual(flowmodel.logRange([[1e-3, 1]]), {low: -3, high: 0});
  assert.deepEqual(flowmodel.logRange([[0.5]]), {low: -1, high: 0});
  assert.equal(flowmodel.logRange([[0, NaN, null], null]), null);
  assert.equal(flowmodel.hasZero([[1, null], [NaN]]), false);
  assert.equal(flowmodel.hasZero([[1, 0]]), true);
  assert.equal(flowmodel.logPosition(1e-2, {low: -3, high: 1}), 0.25);
});

test('decade ticks thin out over many decades and keep the top one', () => {
  assert.deepEqual(flowmodel.decadeTicks({low: -3, high: 0}), [-3, -2, -1, 0]);
  assert.deepEqual(flowmodel.decadeTicks({low: -16, high: 1}), [-15, -11, -7, -3, 1]);
  const wide = flowmodel.decadeTicks({low: -3, high: 39});
  assert.ok(wide.length <= 6 && wide[wide.length - 1] === 39, wide);
});

test('lines break at NaN, step over layers the run lacks; zeros are drawn on their own row', () => {
  const values = [1, 2, NaN, 3, null, 0, 4, Infinity];
  assert.deepEqual(flowmodel.drawableRuns(values, flowmodel.drawableOnLogPanel), [[0, 1], [3, 5, 6]]);
  assert.deepEqual(flowmodel.drawableRuns(values, flowmodel.onLogAxis), [[0, 1], [3], [6]]);
  // The plain CNN's layers on the axis of the same network with BatchNorm: one line, not dots.
  const slots = flowmodel.alignLayers(['conv', 'bn', 'relu', 'head'], ['conv', 'head']);
  assert.deepEqual(flowmodel.drawableRuns(slots.map(({other}) => (other ? 1 : null)), flowmodel.onLogAxis), [[0, 3]]);
  assert.deepEqual(flowmodel.drawableRuns([], Number.isFinite), []);
});

test('kept steps stay sorted, without repeats, the latest four', () => {
  assert.deepEqual(flowmodel.keepStep([], 4), [4]);
  assert.deepEqual(flowmodel.keepStep([4], 2), [2, 4]);
  assert.deepEqual(flowmodel.keepStep([2, 4], 4), [2, 4]);
  assert.deepEqual(flowmodel.keepStep([1, 2, 3, 4], 5), [2, 3, 4, 5]);
});

test('the flow asks for each shown run at the slider step then the kept ones, and draws one line per logged step', () => {
  const wanted = flowmodel.wantedLines('a', 'b', 6, [2, 6, 4]);
  assert.deepEqual(wanted.map(({run, series, pin, side, requested}) => [run, series, pin, side, requested]), [
    ['a', 0, 0, 'primary', 6], ['a', 0, 1, 'primary', 2], ['a', 0, 2, 'primary', 4],
    ['b', 1, 0, 'other', 6], ['b', 1, 1, 'other', 2], ['b', 1, 2, 'other', 4],
  ]);
  // Run a logged steps 2 and 6 (4 is served by 2); run b has nothing at or before 2 or 4.
  const snapshots = [{step: 6}, {step: 2}, {step: 2}, {step: 5}, null, null];
  const lines = flowmodel.distinctLines(wanted, snapshots);
  assert.deepEqual(lines.map(({run, pin, snapshot}) => [run, pin, snapshot.step]), [['a', 0, 6], ['a', 1, 2], ['b', 0, 5]]);
  assert.deepEqual(flowmodel.wantedLines('a', null, 3, []).map(({run, requested}) => [run, requested]), [['a', 3]]);
});

test('the page shows the flush share /step sends, which pools each role\'s precision records in float16 for a float32 layer', () => {
  const clean = latest('clean');
  const pool = clean.layers.find(({layer}) => layer === 'pool');
  assert.equal(pool.layer_dtype, 'float32');
  const share = flowmodel.flushShare(pool, 'input_gradient');
  assert.equal(share, pool.flush_share.input_gradient);
  // What the server sends: the precision record's float16 underflow, as the values are.
  const record = pool.tensors.input_gradient.precision;
  const {to_zero: toZero, subnormal} = record.formats.float16.as_is;
  assert.deepEqual(share, {share: (toZero + subnormal) / record.finite_nonzero, format: 'float16', computes: false,
    flushed: toZero + subnormal, total: record.finite_nonzero});
  // A max pool without ties: a quarter of its input gradient is non-zero, all of it finite.
  const {count, zeros} = pool.tensors.input_gradient.stats;
  assert.equal(share.total * 4, count);
  assert.equal(share.total, count - zeros);
  // The Add's two input gradients pooled, as /step's flow pools them.
  const add = clean.layers.find(({layer}) => layer === 'add');
  const inputs = Object.values(add.tensors).filter(({role}) => role === 'input_gradient');
  assert.equal(inputs.length, 2);
  assert.equal(flowmodel.flushShare(add, 'input_gradient').total,
    inputs[0].precision.finite_nonzero + inputs[1].precision.finite_nonzero);
  // The vanishing sigmoid stack: its first layer's gradient underflows float16 more than the head's.
  const vanishing = latest('vanishing');
  const first = flowmodel.flushShare(vanishing.layers.find(({layer}) => layer === 'body/sigmoid_0'), 'output_gradient');
  const head = flowmodel.flushShare(vanishing.layers.find(({layer}) => layer === 'head'), 'output_gradient');
  assert.ok(first.share > head.share && first.share > 0, `${first.share} vs ${head.share}`);
});

test('the page never recomputes the flush share from the precision records: without flush_share it has none', () => {
  const pool = structuredClone(latest('clean').layers.find(({layer}) => layer === 'pool'));
  // Records that would give another share, and another dtype: the served share is what is shown.
  pool.tensors.output_gradient.precision.formats.float16.as_is.to_zero += 7;
  pool.layer_dtype = 'bfloat16';
  assert.equal(flowmodel.flushShare(pool, 'output_gradient'), pool.flush_share.output_gradient);
  assert.equal(pool.flush_share.output_gradient.format, 'float16');
  // A layer the server sent no share for (no tensor of the role, no record, or a server before it).
  assert.equal(flowmodel.flushShare(pool, 'weight_gradient'), null);
  delete pool.flush_share;
  assert.equal(flowmodel.flushShare(pool, 'output_gradient'), null);
  assert.equal(flowmodel.flushShare(undefined, 'output_gradient'), null);
  // How it is worded, from the served format and whether the layer computes in it.
  assert.equal(flowmodel.flushLabel({format: 'bfloat16', computes: true}), 'flushes in bfloat16');
  assert.equal(flowmodel.flushLabel({format: 'float16', computes: false}), 'would flush in float16');
  assert.equal(flowmodel.flushText({share: 2 / 384, format: 'float16', computes: false, flushed: 2, total: 384}),
    '0.52 % would flush in float16 (2 of 384)');
});

test('the flow has a row of badges for every flag /step raises, the precision flags included', () => {
  assert.deepEqual(flowmodel.FLAGS,
    ['nonfinite', 'vanishing', 'exploding', 'dead', 'underflow', 'overflow', 'block_underflow', 'stalled', 'skipped_steps']);
  const snapshot = latest('vanishing');
  assert.deepEqual(Object.keys(snapshot.health.rules), flowmodel.FLAGS);
});

test('a flush line has the gradient roles only, a share per slot, null where the run lacks the layer', () => {
  const snapshot = latest('clean');
  const slots = flowmodel.alignLayers(layerNames('clean'), ['conv', 'conv_bn', 'pool']);
  const line = flowmodel.flushLine(snapshot, slots, 'primary', [...flowmodel.FLOW_ROLES, 'weight_gradient']);
  assert.deepEqual(Object.keys(line), ['output_gradient', 'input_gradient', 'weight_gradient']);
  const names = slots.map(({primary}) => primary);
  assert.equal(line.output_gradient[names.indexOf(null)], null);
  names.forEach((name, k) => {
    if (name === null) return;
    const layer = snapshot.layers.find((entry) => entry.layer === name);
    assert.deepEqual(line.output_gradient[k], flowmodel.flushShare(layer, 'output_gradient'));
    assert.equal(line.weight_gradient[k], null);
  });
  const other = flowmodel.flushLine(snapshot, slots, 'other');
  assert.equal(other.input_gradient.filter(Boolean).length, 2); // conv and pool
  assert.deepEqual(flowmodel.flushLabels([line.output_gradient, other.output_gradient]), ['would flush in float16']);
  assert.deepEqual(flowmodel.flushLabels([[null], null]), []);
});
