// Every text of the tab that depends on a tensor's role or a layer's pooling:
// decided here, once, from what /runs and /routing serve (role, index,
// pooling.type, backend, device, mass). No DOM, so it runs under node.

import * as model from './model.js';

export const ROLE_TITLES = {
  activation: 'Activation',
  input_gradient: 'Gradient w.r.t. input',
  output_gradient: 'Gradient w.r.t. output',
  weight: 'Weights',
  weight_gradient: 'Gradient w.r.t. weights',
};

/**
 * What each Keras backend runs for a pool, forward and in backprop, by the
 * pooling type /runs serves. Average pools' ops are named on TensorFlow only.
 */
const POOL_OPS = {
  max: {
    tensorflow: {intro: 'In the TensorFlow graph a MaxPool layer is two ops: MaxPool in the forward pass, '
      + 'and MaxPoolGrad, which backprop runs.', forward: 'MaxPool', backward: 'MaxPoolGrad'},
    jax: {intro: 'On JAX, XLA runs a max pool as two ops: reduce_window (max) in the forward pass, '
      + 'and select_and_scatter_add, its gradient, in backprop.', forward: 'reduce_window', backward: 'select_and_scatter_add'},
    torch: {intro: 'On PyTorch a max pool is two kernels: max_pool in the forward pass, which also keeps '
      + 'the index of each maximum, and its backward, which scatters to those indices.',
    forward: 'max_pool', backward: 'max_pool\'s backward'},
  },
  average: {
    tensorflow: {intro: 'An average pool is two ops: AvgPool forward, and AvgPoolGrad in backprop, which spreads '
      + 'each window\'s gradient evenly over the window, so pooling itself adds no zeros.',
    forward: 'AvgPool', backward: 'AvgPoolGrad'},
  },
};

/** The ops of a pooling layer on the backend that wrote its run, or null where they are not named. */
function poolingOps(layer) {
  const byBackend = POOL_OPS[layer.pooling?.type];
  if (!byBackend) return null;
  const backend = layer.backend ?? 'tensorflow';
  // A max pool is a max pool: an unknown backend is described as TensorFlow's.
  return byBackend[backend] ?? (layer.pooling.type === 'max' ? byBackend.tensorflow : null);
}

/**
 * The heading of a tensor: its role's title, with the served index when the
 * layer has several tensors of that role (the inputs of an Add, say).
 *
 * @param {{tensor: string, role: string, index: number}} info a tensor of /runs.
 * @param {object[]} siblings all tensors of its layer in /runs.
 */
export function tensorTitle(info, siblings) {
  if (info.role === 'weight') return `${info.weight} (values)`;
  if (info.role === 'weight_gradient') return `Gradient w.r.t. ${info.weight}`;
  const title = ROLE_TITLES[info.role] ?? info.tensor;
  const several = siblings.filter(({role}) => role === info.role).length > 1;
  return several ? `${title} ${info.index}` : title;
}

/** The side of the layer a tensor lives on, as its shape is named in the UI. */
export function tensorSide(role) {
  if (role === 'weight' || role === 'weight_gradient') return 'weight';
  return role === 'input_gradient' ? 'input' : 'output';
}

/** Where a tensor comes from, named as the backend that wrote the run names the ops. */
export function producedBy(role, layer) {
  if (role === 'weight') return 'the trainable weight at this step';
  if (role === 'weight_gradient') return 'd loss / d weight on the probe batch (backward pass)';
  const ops = poolingOps(layer);
  const forward = ops?.forward ?? layer.layer_class ?? 'layer';
  if (role === 'activation') return `${forward} output (forward pass)`;
  if (role === 'input_gradient') return ops ? `${ops.backward} output (backward pass)` : 'passed to the layer below (backward)';
  return ops ? `upstream gradient, ${ops.backward}'s input` : 'upstream gradient from the layer above';
}

/** "max pool 2×2, stride 2×2, valid", or "global average pool". */
export function describePooling(pooling) {
  if (!pooling) return '';
  const type = pooling.type === 'max' ? 'max' : 'average';
  if (pooling.global) return `global ${type} pool`;
  return `${type} pool ${model.formatShape(pooling.pool_size)}, stride ${model.formatShape(pooling.strides)}, ${pooling.padding}`;
}

// ------------------------------------------------------------ weights

export const WEIGHTS_NOTE = 'Each trainable weight of the layer: its values, the gradient of the probe loss '
  + 'w.r.t. it, and how far it moved between two log events.';

export const UPDATE_RATIO_NOTE = 'Update ratio: |w − w_previous| / |w| between two log events, judged per step. '
  + 'About 10⁻³ per step is the usual healthy size; 10⁻¹ or more means big jumps; 10⁻⁵ or less means the weight barely moves.';

const UPDATE_SIZES = {
  big: 'big jumps (≥ 10⁻¹)',
  above: 'above the usual 10⁻³',
  usual: 'near the usual 10⁻³',
  below: 'below the usual 10⁻³',
  small: 'barely moves (≤ 10⁻⁵)',
};

/** The server's verdict on an update ratio (`size` in /step and /updates), in words ('' for none). */
export function updateSize(size) {
  return UPDATE_SIZES[size] ?? '';
}

/**
 * The update of a weight at one step (`model.updateAt`), in words.
 *
 * @returns {{title: string, ratio: string, size: string, detail: string}}
 */
export function updateSummary(update) {
  const steps = update.interval === 1 ? '1 step' : `${model.formatCount(update.interval)} steps`;
  return {
    title: `Update at step ${update.step}`,
    ratio: model.formatNumber(update.update_ratio),
    size: updateSize(update.size),
    detail: `|Δw| ${model.formatNumber(update.update_norm)} / |w| ${model.formatNumber(update.weight_norm)}, over ${steps}`,
  };
}

/** Why a weight has no update to show. */
export function noUpdateText(hasRecords) {
  return hasRecords ? 'No update at or before this step: the first comes with the second log event.'
    : 'No update records: they start with the second log event.';
}

// ------------------------------------------------------------ explanation

export const HISTOGRAM_NOTE = 'Exact zeros are counted apart (the striped bar); the histogram shows the non-zero '
  + 'values by log magnitude, negative mirrored to the left of 0.';

function maxPoolGeometry(pooling) {
  if (pooling.global) return 'This global pool has one window per map: one position per channel receives gradient.';
  const windows = `This layer's ${model.formatShape(pooling.pool_size)} windows with stride ${model.formatShape(pooling.strides)}`;
  return model.windowsOverlap(pooling)
    ? `${windows} overlap: one position can be the maximum of several windows, which leaves more zeros still.`
    : `${windows} do not overlap: each input position belongs to one window at most.`;
}

function tieRule(layer) {
  const where = `${layer.backend ?? 'tensorflow'}${layer.device ? ` on ${layer.device}` : ''}`;
  const checked = (layer.device ?? 'cpu') === 'cpu'
    ? 'tb_gradviz\'s tests check this rule on the CPU for each backend'
    : 'checked on the CPU by tb_gradviz\'s tests, and seen on an H100 for XLA and PyTorch CUDA';
  return `when several positions of a window hold its maximum (whole windows of ReLU zeros, say), `
    + `this run's backend (${where}) sends the gradient to the first of them in raster order, `
    + `and only to it (${checked}).`;
}

/**
 * What the panels of a layer show and why, by its pooling type.
 *
 * @returns {{intro: string, roles: string[][]}} `roles` as `[title, text]` pairs.
 */
export function explanation(layer) {
  const type = layer.pooling?.type;
  const ops = poolingOps(layer);
  if (type === 'max') {
    return {intro: `Why two tensors? ${ops.intro}`, roles: [
      [ROLE_TITLES.activation, `${ops.forward}'s output: the maximum of each window.`],
      [ROLE_TITLES.output_gradient, `the upstream gradient ${ops.backward} receives, one value per window.`],
      [ROLE_TITLES.input_gradient, `${ops.backward}'s output. Each window's gradient goes to the position `
        + 'that held its maximum; every other position gets an exact zero. '
        + 'A 2×2 pool with stride 2 thus leaves 75 % zeros: geometry, not dead units. '
        + maxPoolGeometry(layer.pooling)],
      ['Ties', tieRule(layer)],
    ]};
  }
  if (type) {
    return {
      intro: ops?.intro ?? 'Backprop through an average pool spreads each window\'s gradient evenly over the '
        + 'window, so pooling itself adds no zeros.',
      roles: [
        [ROLE_TITLES.activation, 'the window averages.'],
        [ROLE_TITLES.output_gradient, 'the upstream gradient, one value per window.'],
        [ROLE_TITLES.input_gradient, ops ? `${ops.backward}'s output, handed to the layer below.`
          : 'each window\'s gradient spread over it, handed to the layer below.'],
      ],
    };
  }
  return {intro: 'The forward output of the layer and the two gradients backprop computes around it.', roles: [
    [ROLE_TITLES.activation, 'the layer\'s output.'],
    [ROLE_TITLES.output_gradient, 'the upstream gradient arriving from the layer above.'],
    [ROLE_TITLES.input_gradient, 'what backprop hands to the layer below.'],
  ]};
}

// ------------------------------------------------------------ routing

/**
 * The routing card of a pooling layer at one step.
 *
 * @param {object} routing one step of /routing (`model.routingAt`).
 * @returns {{title: string, rows: string[][], verdict: {text: string, conserved: ?boolean}}}
 */
export function routingSummary(layer, routing) {
  const count = model.formatCount;
  const rows = [['Routed', `${model.formatPercent(model.routedFraction(routing))} of input positions `
    + `(${count(routing.routed_positions)} of ${count(routing.input_positions)})`]];
  if (layer.pooling?.type === 'max') {
    const predicted = model.predictedRoutedFraction(routing, layer.pooling);
    rows.push(
      ['Predicted', `≤ ${model.formatPercent(predicted)} = windows / input positions `
        + `(${count(routing.windows)} / ${count(routing.input_positions)})`],
      ['Tied windows', `${count(routing.tied_windows)} of ${count(routing.windows)}`],
    );
  } else {
    rows.push(['Predicted', 'every input position inside a window gets a share']);
  }
  rows.push(
    ['Σ grad input', model.formatNumber(routing.input_gradient_sum, 6)],
    ['Σ grad output', model.formatNumber(routing.output_gradient_sum, 6)],
  );
  return {title: `Routing at step ${routing.step}`, rows, verdict: massVerdict(routing)};
}

/** The server's verdict on gradient-mass conservation (the same as tb-gradviz summary's), in words. */
function massVerdict({mass, output_gradient_abs_sum: absSum}) {
  const difference = model.formatNumber(Math.abs(mass.difference), 2);
  const scale = model.formatNumber(absSum, 2);
  const text = mass.conserved === null
    ? '? Gradient mass: this record predates Σ|grad|, which the sums are judged against.'
    : mass.difference === 0 ? '✓ Gradient mass conserved: the sums are equal.' : mass.conserved
      ? `✓ Gradient mass conserved: the sums differ by ${difference}, rounding next to Σ|grad| ≈ ${scale}.`
      : `✗ Gradient mass not conserved: the sums differ by ${difference}, `
        + `${model.formatPercent(mass.relative, 2)} of Σ|grad| ≈ ${scale}.`;
  return {text, conserved: mass.conserved};
}

/** A routing cell of the layer grid: routed share, and the geometry's bound for a max pool. */
export function routingCell(routing, pooling) {
  if (!routing) return '—';
  const routed = model.formatPercent(model.routedFraction(routing));
  const predicted = model.predictedRoutedFraction(routing, pooling);
  return Number.isNaN(predicted) ? routed : `${routed} (≤ ${model.formatPercent(predicted)})`;
}

// ------------------------------------------------------------ health flags

export const FLAG_TITLES = {
  nonfinite: 'NaN / Inf',
  vanishing: 'vanishing',
  exploding: 'exploding',
  dead: 'dead units',
  underflow: 'underflow',
  overflow: 'overflow',
  block_underflow: 'MXFP8 underflow',
  stalled: 'stalled',
  skipped_steps: 'skipped steps',
};

/** The hover text of a flag's badge: its rule as /step serves it (`health.rules`), then its detail. */
export function flagTitle(flag, rules) {
  const rule = rules?.[flag.flag];
  return `${FLAG_TITLES[flag.flag] ?? flag.flag}: ${rule ?? 'no rule served'}\n${flag.detail}`;
}

/** One line on the flags of a /step answer: how many layers raise each. */
export function flagSummary(snapshot) {
  const counts = new Map();
  for (const {flags} of snapshot.layers) for (const {flag} of flags ?? []) counts.set(flag, (counts.get(flag) ?? 0) + 1);
  const flagged = snapshot.layers.filter(({flags}) => flags?.length).length;
  if (flagged === 0) return `${snapshot.run} at step ${snapshot.step}: no flag raised.`;
  const order = [...Object.keys(FLAG_TITLES), ...counts.keys()];
  const parts = [...new Set(order)].filter((flag) => counts.has(flag))
    .map((flag) => `${counts.get(flag)} ${FLAG_TITLES[flag] ?? flag}`);
  const layers = flagged === 1 ? '1 layer' : `${flagged} layers`;
  return `${snapshot.run} at step ${snapshot.step}: ${layers} of ${snapshot.layers.length} flagged (${parts.join(', ')}).`;
}
