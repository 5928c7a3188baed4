// routemapmodel.js over real /routing_map answers (api_answers.mjs): runs
// "clean" and "nan" (a 2x2/2 max pool over a convolution without ReLU, a
// 2x2/2 average pool; "nan" has a NaN in the probe) and "relu" (over ReLU
// zeros: ResNet50's stem pool, 3x3/2 after ZeroPadding2D(1); a 3x3/2 pool
// with same padding; a 1D pool), each at its last and its first step.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {formatNumber} from '../../frontend/model.js';
import * as routemap from '../../frontend/routemapmodel.js';
import {answer, layerOf, recordedFetch, runs} from './api_answers.mjs';

const POOLS = [['clean', 'pool'], ['clean', 'avg'], ['nan', 'pool'], ['nan', 'avg'],
  ['relu', 'stem_pool'], ['relu', 'same_pool'], ['relu', 'pool_1d'], ['weights', 'pool']];

/** Every recorded /routing_map answer: each pool at its last step and its first. */
function maps() {
  return POOLS.flatMap(([run, layer]) => {
    const last = answer('routing_map', {run, layer});
    return [last, answer('routing_map', {run, layer, step: String(last.steps[0])})];
  });
}

const mapOf = (run, layer) => answer('routing_map', {run, layer});

test('the tab asks for a map exactly where the server has one', async () => {
  const pools = runs.flatMap(({run, layers}) => layers.filter(({pooling}) => pooling).map((layer) => [run, layer.layer]));
  assert.deepEqual(pools, POOLS);
  for (const {run, layers} of runs) {
    for (const layer of layers) {
      assert.equal(routemap.mayHaveRoutingMap(layer), Boolean(layer.pooling), `${run} ${layer.layer}`);
    }
  }
  const pool = layerOf('clean', 'pool');
  assert.equal(pool.routing_map, true);  // /runs says so
  // A server that does not say, and a run written without a device (synthetic runs, files
  // from before backends): no map is asked for.
  assert.equal(routemap.mayHaveRoutingMap({...pool, routing_map: undefined, device: undefined}), false);
  assert.equal(routemap.mayHaveRoutingMap({...pool, routing_map: false}), false);
  assert.equal(routemap.mayHaveRoutingMap({...pool, device: undefined, routing_map: true}), true);
  const pool3d = {...pool, routing_map: undefined, tensors: pool.tensors.map((t) => ({...t, shape: [...t.shape, 2]}))};
  assert.equal(routemap.mayHaveRoutingMap(pool3d), true);  // 3D pools are mapped too (a depth slice)
  const fetched = await routemap.fetchRoutingMap('relu', 'stem_pool', 2, recordedFetch);
  assert.deepEqual(fetched, answer('routing_map', {run: 'relu', layer: 'stem_pool', step: '2'}));
});

test('the map step follows the tab\'s step: the latest at or before it, else the first', () => {
  assert.deepEqual(mapOf('clean', 'pool').steps, [2, 4]);
  assert.equal(routemap.mapStepFor([2, 4], 4), 4);
  assert.equal(routemap.mapStepFor([2, 4], 3), 2);
  assert.equal(routemap.mapStepFor([2, 4], 1), 2);
  assert.equal(routemap.mapStepFor([2, 4], 99), 4);
});

test('the windows are cut as the server serves them: every served window lies in its axes\' range', () => {
  // ResNet50's pool1_pool at 64 px: a 34x34 input, 3x3 windows, stride 2, valid: 16 a side.
  const axis = {kernel: 3, stride: 2, before: 0, count: 16};
  assert.deepEqual(routemap.coveringWindows(axis, 0), [0, 0]);
  assert.deepEqual(routemap.coveringWindows(axis, 2), [0, 1]); // the shared row of windows 0 and 1
  assert.deepEqual(routemap.coveringWindows(axis, 32), [15, 15]);
  assert.deepEqual(routemap.coveringWindows(axis, 33), [16, 15]); // no window reaches the last row
  // SAME padding: the first window starts one position before the map.
  assert.deepEqual(routemap.coveringWindows({kernel: 3, stride: 2, before: 1, count: 3}, 0), [0, 0]);
  for (const map of maps()) {
    const layout = routemap.mapLayout(map);
    assert.deepEqual(layout.axes, [map.axes.rows, map.axes.cols]);
    assert.ok(map.windows.row + map.windows.rows <= map.axes.rows.count, `${map.run} ${map.layer}`);
    assert.ok(map.windows.col + map.windows.cols <= map.axes.cols.count, `${map.run} ${map.layer}`);
  }
});

test('every window holds its served winner, the first maximum of the window in raster order', () => {
  let windows = 0;
  for (const map of maps()) {
    const layout = routemap.mapLayout(map);
    assert.equal(layout.rects.length, map.windows.rows * map.windows.cols);
    layout.axes.forEach((axis, a) => assert.ok(
      (a === 0 ? map.windows.row + map.windows.rows : map.windows.col + map.windows.cols) <= axis.count));
    for (const channel of map.channels) {
      layout.rects.forEach((rect, k) => {
        const cells = routemap.windowCells(layout, rect).filter(({pad}) => !pad);
        assert.ok(cells.every(({index}) => index >= 0), 'a served window lies inside the crop');
        if (map.pooling.type !== 'max') {
          assert.equal(channel.winner[k], -1);
          assert.equal(channel.tied[k], null);
          return;
        }
        const values = cells.map(({index}) => channel.input[index]);
        if (values.some(Number.isNaN)) return; // the server's argmax takes the NaN
        const peak = Math.max(...values);
        assert.equal(channel.winner[k], cells[values.indexOf(peak)].index, `${map.run} ${map.layer} window ${k}`);
        assert.equal(channel.tied[k], values.filter((v) => v === peak).length > 1);
        windows += 1;
      });
    }
  }
  assert.ok(windows > 500, `${windows} windows checked`);
});

test('over ReLU zeros whole windows tie and the first position wins; overlapping windows share positions', () => {
  const map = mapOf('relu', 'stem_pool');
  const layout = routemap.mapLayout(map);
  let allZero = 0;
  let shared = 0;
  map.channels.forEach((channel, c) => {
    const routing = routemap.channelRouting(map, layout, c);
    assert.equal(routing.tiedWindows, channel.tied.filter(Boolean).length);
    assert.ok(routing.tiedWindows > 0);
    layout.rects.forEach((rect, k) => {
      if (!channel.tied[k]) return assert.deepEqual(routing.tiedAt[k], []);
      const [first, ...others] = routing.tiedAt[k];
      assert.equal(first, channel.winner[k]);
      assert.ok(others.length > 0 && others.every((i) => i > first && channel.input[i] === channel.input[first]));
      const cells = routemap.windowCells(layout, rect);
      if (cells.every(({index}) => channel.input[index] === 0)) {
        allZero += 1;
        // The window's top-left position, be it ZeroPadding2D's zero or the ReLU's.
        assert.equal(channel.winner[k], cells[0].index);
        assert.equal(routing.tiedAt[k].length, 9);
      }
    });
    shared += [...routing.routedFrom].filter((n) => n > 1).length;
    assert.equal([...routing.routedFrom].reduce((a, b) => a + b, 0), layout.rects.length);
  });
  assert.ok(allZero > 0, 'no all-zero window in the fixture');
  // Tied windows pass on a gradient (a convolution follows the pool), so the check below tests the rule.
  assert.ok(map.channels.some(({tied, output_gradient: g}) => tied.some((t, k) => t && g[k] !== 0)));
  assert.ok(shared > 0, 'no position won by two overlapping windows in the fixture');
});

test('TensorFlow\'s input gradient is what the winners (or even shares) predict, everywhere compared', () => {
  for (const map of maps()) {
    const layout = routemap.mapLayout(map);
    map.channels.forEach((channel, c) => {
      const {check} = routemap.channelRouting(map, layout, c);
      assert.deepEqual(check.differing, [], `${map.run} ${map.layer} channel ${channel.channel}`);
      // Every position of these small maps is compared, but the NaN's (non-finite) and the stem's last row and column.
      const skipped = channel.input_gradient.filter((g) => !Number.isFinite(g)).length;
      const uncovered = map.layer === 'stem_pool' ? 12 + 12 - 1 : 0;
      assert.ok(check.checked >= channel.input.length - skipped - uncovered - 4 * map.crop.width,
        `${map.run} ${map.layer}: ${check.checked} of ${channel.input.length}`);
    });
    assert.match(routemap.checkSentence(map, routemap.channelRouting(map, layout, 0)),
      /^✓ tensorflow's input gradient is/);
  }
  // A backend that sent a tied window's gradient to its last maximum instead: those cells differ.
  const map = structuredClone(mapOf('relu', 'stem_pool'));
  const layout = routemap.mapLayout(map);
  const c = map.channels.findIndex((_, i) => routemap.channelRouting(map, layout, i).tiedAt.some((at) => at.length > 1));
  const {tiedAt} = routemap.channelRouting(map, layout, c);
  const gradient = map.channels[c].input_gradient;
  const at = tiedAt.find((cells) => cells.length > 1 && gradient[cells[0]] !== gradient[cells[cells.length - 1]]);
  const [first, last] = [at[0], at[at.length - 1]];
  [gradient[first], gradient[last]] = [gradient[last], gradient[first]];
  const {check} = routemap.channelRouting(map, layout, c);
  assert.deepEqual(check.differing, [first, last]);
  assert.match(routemap.checkSentence(map, {check}), /^✗ tensorflow's input gradient differs .* at 2 of /);
});

test('a point of the map shows the window it is deepest in; none where no window reaches', () => {
  const map = mapOf('relu', 'stem_pool');
  const layout = routemap.mapLayout(map);
  for (const rect of layout.rects) {
    assert.equal(routemap.windowAt(layout, rect.top + rect.height / 2, rect.left + rect.width / 2), rect.index);
  }
  // Row 2 is shared by window rows 0 and 1: its upper part is window 0's, its lower part window 1's.
  assert.equal(routemap.windowAt(layout, 2.2, 1.5), 0);
  assert.equal(routemap.windowAt(layout, 2.8, 1.5), 5);
  // 3x3/2 valid on 12 positions: rows 0-10 are covered, row 11 by no window.
  assert.equal(routemap.windowAt(layout, 11.5, 1.5), -1);
  const same = routemap.mapLayout(mapOf('relu', 'same_pool'));
  assert.deepEqual([same.rects[0].top, same.rects[0].left], [-1, -1]); // padding before the first window
  assert.equal(routemap.windowAt(same, 0.5, 0.5), 0);
});

test('the hover of a window: its values, its winner, and the gradient it sent', () => {
  const map = mapOf('relu', 'stem_pool');
  const layout = routemap.mapLayout(map);
  const routing = routemap.channelRouting(map, layout, 0);
  const k = routing.tiedAt.findIndex((at) => at.length > 1);
  const details = routemap.windowDetails(map, layout, routing, k);
  const rows = Object.fromEntries(details.rows);
  const winner = routemap.cellPosition(map, map.channels[0].winner[k]);
  assert.equal(rows.winner, `(${winner.row}, ${winner.col}), the first of ${routing.tiedAt[k].length} tied positions`);
  assert.equal(rows.sent,
    `${formatNumber(map.channels[0].output_gradient[k])}, all of it to (${winner.row}, ${winner.col})`);
  assert.equal(details.grid.length, 3);
  assert.equal(details.grid.flat().filter((cell) => cell.winner).length, 1);
  assert.equal(details.grid.flat().filter((cell) => cell.tied).length, routing.tiedAt[k].length - 1);

  const avg = mapOf('clean', 'avg');
  const avgRouting = routemap.channelRouting(avg, routemap.mapLayout(avg), 1);
  const avgRows = Object.fromEntries(routemap.windowDetails(avg, routemap.mapLayout(avg), avgRouting, 0).rows);
  assert.match(avgRows.sent, / \/ 4 = .* to each of its 4 positions$/);
  assert.equal(avgRows.window, '(0, 0): rows 0–1, cols 0–1');
  const same = mapOf('relu', 'same_pool');
  const sameRows = Object.fromEntries(routemap.windowDetails(same, routemap.mapLayout(same),
    routemap.channelRouting(same, routemap.mapLayout(same), 0), 0).rows);
  assert.equal(sameRows.window, '(0, 0): rows 0–1, cols 0–1, 5 padding');
});

test('texts: the tie rule with the backend that wrote it, and where the crop lies', () => {
  assert.equal(routemap.tieRule(mapOf('relu', 'stem_pool')), 'Ties: first maximum in raster order (tensorflow on cpu).');
  assert.match(routemap.tieRule(mapOf('clean', 'avg')), /^Average pool: .* \(tensorflow on cpu\)\.$/);
  assert.equal(routemap.describeMap(mapOf('relu', 'stem_pool')),
    'Example 0 · the whole 12×12 map · 25 windows 3×3, stride 2×2, valid');
  const cropped = {...mapOf('relu', 'stem_pool'), map: {height: 114, width: 114},
    crop: {row: 20, col: 21, height: 12, width: 12}};
  assert.match(routemap.describeMap(cropped), /rows 20–31, cols 21–32 of the 114×114 map \(cropped/);
});

test('shades: an exact zero is 0, the smallest non-zero gradient is still visible', () => {
  assert.equal(routemap.logShade(0, 1), 0);
  assert.equal(routemap.logShade(1e-12, 1), 0.15);
  assert.equal(routemap.logShade(-1, 1), 1);
  assert.equal(routemap.linearShade(0, 2), 0);
  assert.ok(routemap.linearShade(1e-9, 2) >= 0.08);
  assert.equal(routemap.linearShade(2, 2), 1);
});
