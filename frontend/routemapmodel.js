// The routing map of a pooling layer (/routing_map, docs/API.md), shaped for
// drawing: where each window lies on the served crop, its winner and ties,
// which window a point of the map shows, and whether the backend's input
// gradient went where the winners say. No DOM, so it runs under `node --test`.

import {fetchJson, formatCount, formatNumber, formatShape} from './model.js';

export function fetchRoutingMap(run, layer, step, fetchImpl) {
  return fetchJson('routing_map', {run, layer, step}, fetchImpl);
}

/**
 * Whether a /runs layer is worth asking /routing_map for, so that the tab
 * asks for no map that is not there (a 404 is an error in the browser log).
 * `routing_map`, when /runs serves it, decides. Without it: a 1D, 2D or 3D pool
 * written by a callback that records the device, as the callbacks that write
 * maps all do (synthetic and older runs lack it).
 */
export function mayHaveRoutingMap(layer) {
  if (typeof layer?.routing_map === 'boolean') return layer.routing_map;
  if (!layer?.pooling || layer.device === null || layer.device === undefined) return false;
  const input = layer.tensors?.find(({role}) => role === 'input_gradient');
  if (input?.shape) return input.shape.length >= 3 && input.shape.length <= 5;
  return true;
}

/** The map step shown for the tab's step: the latest `<= step`, else the first. */
export function mapStepFor(steps, step) {
  let found = steps[0];
  for (const s of steps) if (s <= step) found = s;
  return found;
}

// ------------------------------------------------------------ geometry

/** The windows `[first, last]` of an axis that hold input position `p` (first > last: none). */
export function coveringWindows(axis, p) {
  const first = Math.max(0, Math.ceil((p + axis.before - axis.kernel + 1) / axis.stride));
  const last = Math.min(axis.count - 1, Math.floor((p + axis.before) / axis.stride));
  return [first, last];
}

/**
 * Where the served windows lie on the crop. `axes` are the answer's rows and
 * columns as the server cuts them (`kernel`, `stride`, padding `before` the
 * first position, window `count`). `rects[k]` is window k of the answer
 * (row-major over the window range): its window indices `row`, `col` and its
 * rectangle in crop cells (`top`, `left`, `height`, `width`), which may reach
 * past the crop or the map (padding).
 */
export function mapLayout(answer) {
  const axes = [answer.axes.rows, answer.axes.cols];
  const {crop, windows} = answer;
  const rects = [];
  for (let i = 0; i < windows.rows; i++) {
    for (let j = 0; j < windows.cols; j++) {
      const row = windows.row + i;
      const col = windows.col + j;
      rects.push({index: rects.length, row, col,
        top: row * axes[0].stride - axes[0].before - crop.row, left: col * axes[1].stride - axes[1].before - crop.col,
        height: axes[0].kernel, width: axes[1].kernel});
    }
  }
  return {axes, map: answer.map, crop, windows, rects};
}

/** The crop cells of a window, row-major: `{row, col, index}` (index -1 outside the crop, `pad` outside the map). */
export function windowCells(layout, rect) {
  const {crop, map} = layout;
  const cells = [];
  for (let r = rect.top; r < rect.top + rect.height; r++) {
    for (let c = rect.left; c < rect.left + rect.width; c++) {
      const inCrop = r >= 0 && r < crop.height && c >= 0 && c < crop.width;
      const mapRow = r + crop.row;
      const mapCol = c + crop.col;
      cells.push({row: mapRow, col: mapCol, index: inCrop ? r * crop.width + c : -1,
        pad: mapRow < 0 || mapRow >= map.height || mapCol < 0 || mapCol >= map.width});
    }
  }
  return cells;
}

/**
 * The window a point of the crop shows (`y`, `x` in cells, fractional): of
 * the served windows holding it, the one whose centre is nearest, so that
 * each part of an overlap belongs to the window it is deepest in. -1 where
 * no served window holds it.
 */
export function windowAt(layout, y, x) {
  const {axes, crop, windows} = layout;
  const [rowFirst, rowLast] = coveringWindows(axes[0], Math.floor(y) + crop.row);
  const [colFirst, colLast] = coveringWindows(axes[1], Math.floor(x) + crop.col);
  let best = -1;
  let bestDistance = Infinity;
  for (let row = Math.max(rowFirst, windows.row); row <= Math.min(rowLast, windows.row + windows.rows - 1); row++) {
    for (let col = Math.max(colFirst, windows.col); col <= Math.min(colLast, windows.col + windows.cols - 1); col++) {
      const rect = layout.rects[(row - windows.row) * windows.cols + (col - windows.col)];
      const distance = (y - rect.top - rect.height / 2) ** 2 + (x - rect.left - rect.width / 2) ** 2;
      if (distance < bestDistance) {
        best = rect.index;
        bestDistance = distance;
      }
    }
  }
  return best;
}

// ------------------------------------------------------------ one channel

// Relative difference below which the backend's input gradient counts as what
// the winners predict: float32 sums of up to four windows, or float16 ones.
const AGREEMENT_TOLERANCE = 1e-2;

/**
 * One channel of an answer, ready to draw.
 *
 * @returns {object} `channel`, `input`, `gradient` (the crop, row-major),
 *   `upstream` (per window), `max` (`input`, `gradient`, `upstream`: the
 *   largest finite magnitude), `tiedAt` (per window: the crop indices holding
 *   its tied maximum, winner first; [] when not tied), `routedFrom` (per crop
 *   cell: how many windows it won), `tiedWindows`, `gradientZeros`, and
 *   `check` (`{checked, differing}`: the crop cells where the backend's input
 *   gradient was compared with the winners' routing, and those that differ).
 */
export function channelRouting(answer, layout, index) {
  const channel = answer.channels[index];
  const {input, input_gradient: gradient, winner, tied, output_gradient: upstream} = channel;
  const routedFrom = new Uint16Array(input.length);
  const tiedAt = layout.rects.map((rect, k) => {
    if (winner[k] >= 0) routedFrom[winner[k]] += 1;
    if (!tied[k] || winner[k] < 0) return [];
    const peak = input[winner[k]];
    return windowCells(layout, rect).filter(({index: i}) => i >= 0 && input[i] === peak).map(({index: i}) => i);
  });
  return {
    channel: channel.channel, input, gradient, winner, tied, upstream, tiedAt, routedFrom,
    max: {input: largestMagnitude(input), gradient: largestMagnitude(gradient), upstream: largestMagnitude(upstream)},
    tiedWindows: tied.filter((t) => t === true).length,
    gradientZeros: gradient.filter((g) => g === 0).length,
    check: routingCheck(answer, layout, channel),
  };
}

function largestMagnitude(values) {
  let largest = 0;
  for (const v of values) if (Number.isFinite(v) && Math.abs(v) > largest) largest = Math.abs(v);
  return largest;
}

/**
 * Compares the backend's input gradient with what the rule shown predicts:
 * a max pool sends each window's upstream gradient to its winner, an average
 * pool shares it evenly over the window's positions inside the map. Only crop
 * cells all of whose windows were served are compared (the others may hold
 * gradient from windows outside the crop), and only finite values.
 */
export function routingCheck(answer, layout, channel) {
  const {crop} = layout;
  const expected = new Float64Array(crop.height * crop.width);
  const isMax = answer.pooling.type === 'max';
  layout.rects.forEach((rect, k) => {
    const g = channel.output_gradient[k];
    if (isMax) {
      if (channel.winner[k] >= 0) expected[channel.winner[k]] += g;
      return;
    }
    const cells = windowCells(layout, rect).filter(({pad}) => !pad);
    for (const {index} of cells) if (index >= 0) expected[index] += g / cells.length;
  });
  const served = layout.axes.map((axis, a) => {
    const [offset, first, count] = a === 0
      ? [crop.row, layout.windows.row, layout.windows.rows] : [crop.col, layout.windows.col, layout.windows.cols];
    const size = a === 0 ? crop.height : crop.width;
    return Array.from({length: size}, (_, p) => {
      const [low, high] = coveringWindows(axis, p + offset);
      return low > high || (low >= first && high < first + count);
    });
  });
  let checked = 0;
  const differing = [];
  for (let r = 0; r < crop.height; r++) {
    if (!served[0][r]) continue;
    for (let c = 0; c < crop.width; c++) {
      const i = r * crop.width + c;
      const e = expected[i];
      const a = channel.input_gradient[i];
      if (!served[1][c] || !Number.isFinite(e) || !Number.isFinite(a)) continue;
      checked += 1;
      if ((e === 0) !== (a === 0) || Math.abs(e - a) > AGREEMENT_TOLERANCE * Math.max(Math.abs(e), Math.abs(a))) {
        differing.push(i);
      }
    }
  }
  return {checked, differing};
}

// ------------------------------------------------------------ shading

/** 0 for an exact zero, else 0.08..1 in proportion to |v| / max (a linear map). */
export function linearShade(value, max) {
  if (value === 0 || !(max > 0)) return 0;
  return Math.min(1, 0.08 + 0.92 * Math.abs(value) / max);
}

/**
 * 0 for an exact zero, else 0.15..1 by |v| on a log axis over `decades`
 * below max, so that a small non-zero gradient stays visible and apart from
 * a zero.
 */
export function logShade(value, max, decades = 3) {
  if (value === 0 || !(max > 0)) return 0;
  const position = 1 + Math.log10(Math.abs(value) / max) / decades;
  return 0.15 + 0.85 * Math.min(1, Math.max(0, position));
}

// ------------------------------------------------------------ text

function where(answer) {
  return `${answer.backend ?? 'tensorflow'}${answer.device ? ` on ${answer.device}` : ''}`;
}

/** The rule the winners follow, and whose it is. */
export function tieRule(answer) {
  if (answer.pooling.type !== 'max') {
    return `Average pool: each window's gradient is shared evenly by its positions inside the map (${where(answer)}).`;
  }
  return `Ties: first maximum in raster order (${where(answer)}).`;
}

/** Whether the backend's input gradient agrees with the winners, in words. */
export function checkSentence(answer, routing) {
  const {checked, differing} = routing.check;
  const whose = `${answer.backend ?? 'tensorflow'}'s input gradient`;
  const shown = answer.pooling.type === 'max' ? 'these winners' : 'even shares';
  if (checked === 0) return `No position of this crop has all its windows served, so ${whose} is not compared.`;
  if (differing.length === 0) {
    return `✓ ${whose} is what ${shown} predict at all ${formatCount(checked)} positions compared.`;
  }
  return `✗ ${whose} differs from what ${shown} predict at ${formatCount(differing.length)} of `
    + `${formatCount(checked)} positions (outlined).`;
}

/** Example, crop and windows of an answer, in one line. */
export function describeMap(answer) {
  const {map, crop, windows, pooling} = answer;
  const whole = crop.height === map.height && crop.width === map.width;
  const part = whole ? `the whole ${map.height}×${map.width} map`
    : `rows ${crop.row}–${crop.row + crop.height - 1}, cols ${crop.col}–${crop.col + crop.width - 1} `
      + `of the ${map.height}×${map.width} map (cropped to fit the record)`;
  const size = pooling.global ? 'one global window' : `${formatCount(windows.rows * windows.cols)} windows `
    + `${formatShape(pooling.pool_size)}, stride ${formatShape(pooling.strides)}, ${pooling.padding}`;
  return `Example ${answer.example} · ${part} · ${size}`;
}

const position = (cell) => `(${cell.row}, ${cell.col})`;

/** The map position (row, col) of a crop cell index. */
export function cellPosition(answer, index) {
  return {row: answer.crop.row + Math.floor(index / answer.crop.width), col: answer.crop.col + (index % answer.crop.width)};
}

/**
 * What the hover shows of window k: `title`, `rows` of `[name, value]`, and
 * `grid`: the window's values by row (null outside the crop), with the
 * winner's and the tied positions' places, when the window is small enough
 * to list.
 */
export function windowDetails(answer, layout, routing, k) {
  const rect = layout.rects[k];
  const cells = windowCells(layout, rect);
  const inside = cells.filter(({pad}) => !pad);
  const first = inside[0] ?? cells[0];
  const last = inside[inside.length - 1] ?? cells[cells.length - 1];
  const g = routing.upstream[k];
  const rows = [['window', `(${rect.row}, ${rect.col}): rows ${first.row}–${last.row}, cols ${first.col}–${last.col}`
    + (inside.length < cells.length ? `, ${cells.length - inside.length} padding` : '')]];
  const winner = routing.winner[k];
  if (answer.pooling.type === 'max') {
    if (winner >= 0) {
      const at = cellPosition(answer, winner);
      const ties = routing.tiedAt[k].length;
      rows.push(
        ['maximum', formatNumber(routing.input[winner])],
        ['winner', ties > 1 ? `${position(at)}, the first of ${ties} tied positions` : position(at)],
        ['sent', `${formatNumber(g)}, all of it to ${position(at)}`],
        [`input gradient at ${position(at)}`, `${formatNumber(routing.gradient[winner])}`
          + (routing.routedFrom[winner] > 1 ? `, from ${routing.routedFrom[winner]} windows` : '')],
      );
    } else {
      rows.push(['winner', 'outside the crop'], ['sent', formatNumber(g)]);
    }
  } else {
    const known = inside.filter(({index}) => index >= 0).map(({index}) => routing.input[index]);
    if (known.length === inside.length) rows.push(['mean', formatNumber(known.reduce((a, b) => a + b, 0) / known.length)]);
    rows.push(['sent', `${formatNumber(g)} / ${inside.length} = ${formatNumber(g / inside.length)} to each of its `
      + `${inside.length} positions`]);
  }
  const listed = rect.height * rect.width <= 49;
  const tied = new Set(routing.tiedAt[k]);
  const grid = listed ? Array.from({length: rect.height}, (_, r) => cells.slice(r * rect.width, (r + 1) * rect.width)
    .map(({index, pad}) => ({value: pad ? 'pad' : index < 0 ? '·' : formatNumber(routing.input[index]),
      winner: index >= 0 && index === winner, tied: index >= 0 && index !== winner && tied.has(index)}))) : null;
  return {title: `Window (${rect.row}, ${rect.col}) of channel ${routing.channel}`, rows, grid};
}
