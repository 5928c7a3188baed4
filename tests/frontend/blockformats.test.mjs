// blockformats.js and the time view's block-format colour over real API answers
// (api_answers.mjs): run "clean" (conv, pool, avg, add), whose precision records
// have the block part.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as blockformats from '../../frontend/blockformats.js';
import * as layout from '../../frontend/timelinelayout.js';
import * as timelinemodel from '../../frontend/timelinemodel.js';
import {answer} from './api_answers.mjs';

test('shares, errors and verdicts are worded as the panel shows them', () => {
  const {shareText, errorText, survivalText} = blockformats;
  assert.deepEqual([0, 0.0005, 0.001, 0.5, 1, null, NaN].map(shareText), ['0', '<0.1%', '0.1%', '50.0%', '100.0%', '–', '–']);
  assert.deepEqual([0, 2.5e-4, 0.0123, 1.5, null].map(errorText), ['0', '2.5e-4', '1.2e-2', '1.5e0', '–']);
  assert.deepEqual([true, false, null].map(survivalText), ['survives', 'fails', '–']);
  assert.deepEqual(Object.keys(blockformats.BLOCK_FORMAT_NAMES), blockformats.BLOCK_FORMATS);
  assert.deepEqual(Object.keys(blockformats.BLOCK_SIZES), blockformats.BLOCK_FORMATS);
});

test('every tensor of every layer has a row whose cells word the served shares of its record', () => {
  const snapshot = answer('step', {run: 'clean'});
  let cells = 0;
  for (const layer of snapshot.layers) {
    const rows = blockformats.blockRows(layer);
    assert.ok(blockformats.hasBlockPart(layer), layer.layer);
    assert.deepEqual(rows.map((row) => row.tensor), Object.keys(layer.tensors), layer.layer);
    for (const row of rows) {
      const {precision, block_headroom: served} = layer.tensors[row.tensor];
      assert.equal(row.total, precision.finite_nonzero);
      assert.deepEqual(Object.keys(served), blockformats.BLOCK_FORMATS);
      for (const format of blockformats.BLOCK_FORMATS) {
        const counts = precision.block_formats[format];
        const shares = served[format];
        // The server's shares are the record's counts over the non-zero values and the blocks.
        assert.equal(shares.to_zero, counts.to_zero / precision.finite_nonzero);
        assert.equal(shares.wide_blocks, counts.wide_blocks / counts.blocks);
        assert.equal(shares.relative_error, counts.relative_error);
        assert.equal(shares.survives, counts.to_zero <= 0.01 * precision.finite_nonzero);
        const cell = row.cells[format];
        assert.equal(cell.verdict, shares.survives ? 'survives' : 'fails');
        assert.deepEqual(cell.lines.map(({text}) => text), [
          `0: ${blockformats.shareText(shares.to_zero)}`,
          `sub: ${blockformats.shareText(shares.subnormal)}`,
          `sat: ${blockformats.shareText(shares.saturated)}`,
          `wide: ${blockformats.shareText(shares.wide_blocks)}`,
          `err: ${blockformats.errorText(shares.relative_error)}`,
        ]);
        assert.ok(cell.title.includes(`of ${precision.finite_nonzero} finite non-zero values, `
          + `${counts.to_zero} become zero`), cell.title);
        cells++;
      }
    }
  }
  assert.ok(cells >= 6 * 4);
});

test('a record without the block part gives no row, and a layer without any says so', () => {
  const layer = answer('step', {run: 'clean'}).layers[0];
  // The same answer as a run written before the block part: no block_formats, no block_headroom.
  const older = {...layer, tensors: Object.fromEntries(Object.entries(layer.tensors).map(([name, entry]) =>
    [name, {...entry, block_headroom: null, precision: {...entry.precision, block_formats: null}}]))};
  assert.deepEqual(blockformats.blockRows(older), []);
  assert.equal(blockformats.hasBlockPart(older), false);
  assert.deepEqual(blockformats.blockRows(undefined), []);
});

test('the time view colours by the MXFP8 E4M3 share to zero that /step serves at the last step', () => {
  const body = answer('timeline', {run: 'clean', field: 'block_zero_share'});
  const latest = answer('step', {run: 'clean'});
  const matrix = timelinemodel.timelineMatrix(body);
  assert.equal(body.columns.last_step.at(-1), latest.step);
  assert.deepEqual(matrix.rows.map((row) => row.layer), latest.layers.map((layer) => layer.layer));
  for (const row of matrix.rows) {
    assert.equal(row.format, 'mxfp8_e4m3');
    const tensors = Object.values(latest.layers.find((entry) => entry.layer === row.layer).tensors)
      .filter((entry) => entry.role === 'output_gradient');
    const zeros = tensors.reduce((sum, entry) => sum + entry.precision.block_formats.mxfp8_e4m3.to_zero, 0);
    const total = tensors.reduce((sum, entry) => sum + entry.precision.finite_nonzero, 0);
    assert.equal(row.envelope.max.at(-1), zeros / total, row.layer);
    assert.equal(row.values.at(-1), zeros / total); // a plain fraction, not a log
  }
  assert.equal(layout.colourTitle('block_zero_share', 'output_gradient', false),
    'MXFP8 E4M3 share to zero of the output gradient, 0 to 100 %');
  assert.equal(timelinemodel.FIELD_TITLES.block_zero_share, 'share that becomes zero in MXFP8 E4M3');
  assert.match(timelinemodel.describeCell(matrix, {row: 0, column: 0}), /^conv, step \d+: block_zero_share in mxfp8_e4m3 \d/);
});
