// The precision panel of the layer view: per tensor of the layer, what a
// cast to float16, bfloat16 and float8 would do to its values (the
// precision record that /step serves with each tensor). The counts and the
// flags are the server's; this module only words them. Under it, the block
// formats of the same tensors (blocktable.js). DOM only.

import {blockTable} from './blocktable.js';
import {html} from './dom.js';

export const FORMATS = ['float16', 'bfloat16', 'float8_e4m3fn', 'float8_e5m2'];
const FORMAT_NAMES = {float16: 'float16', bfloat16: 'bfloat16', float8_e4m3fn: 'fp8 e4m3', float8_e5m2: 'fp8 e5m2'};
const SETTINGS = {as_is: 'as is', scaled: 'scaled to amax'};

/** A share as the panel writes it: "0", "<0.1%", "12.5%". */
export function formatShare(count, total) {
  if (!count) return '0';
  const share = (100 * count) / total;
  return share < 0.1 ? '<0.1%' : `${share.toFixed(1)}%`;
}

/**
 * The rows of the panel, one per tensor of the layer with a precision record:
 * `{tensor, role, total, cells: {format: {setting: {to_zero, subnormal, overflow}}}}`,
 * each count worded as a share of the tensor's finite non-zero values.
 */
export function precisionRows(layerSnapshot) {
  const rows = [];
  for (const [tensor, entry] of Object.entries(layerSnapshot?.tensors ?? {})) {
    const record = entry.precision;
    if (!record) continue;
    const total = record.finite_nonzero;
    const cells = {};
    for (const format of FORMATS) {
      cells[format] = {};
      for (const setting of Object.keys(SETTINGS)) {
        const counts = record.formats[format][setting];
        cells[format][setting] = {
          to_zero: formatShare(counts.to_zero, total),
          subnormal: formatShare(counts.subnormal, total),
          overflow: formatShare(counts.overflow, total),
        };
      }
    }
    rows.push({tensor, role: entry.role, total, cells});
  }
  return rows;
}

/** Fills `container` with the layer's precision table (`layerSnapshot`: its /step entry). */
export function renderPrecision(container, layerSnapshot) {
  const rows = precisionRows(layerSnapshot);
  if (!rows.length) {
    container.replaceChildren(html('p', {className: 'empty', text:
      'No precision record at this step (a run written before tb_gradviz recorded one).'}));
    return;
  }
  const flagged = new Set((layerSnapshot.flags ?? [])
    .filter((flag) => flag.flag === 'underflow' || flag.flag === 'overflow')
    .flatMap((flag) => flag.tensors ?? [flag.tensor]));
  const head = html('thead', {}, [
    html('tr', {}, [
      html('th', {text: 'tensor', attrs: {rowspan: 2, scope: 'col'}}),
      html('th', {text: 'non-zero values', attrs: {rowspan: 2, scope: 'col'}}),
      ...FORMATS.map((format) => html('th', {text: FORMAT_NAMES[format], attrs: {colspan: 2, scope: 'colgroup'}})),
    ]),
    html('tr', {}, FORMATS.flatMap(() => Object.values(SETTINGS).map((text) => html('th', {text, attrs: {scope: 'col'}})))),
  ]);
  const body = html('tbody', {}, rows.map((row) => html('tr', {
    className: flagged.has(row.tensor) ? 'flagged' : undefined,
    attrs: {'data-tensor': row.tensor},
  }, [
    html('th', {text: row.tensor, attrs: {scope: 'row'}}),
    html('td', {text: String(row.total)}),
    ...FORMATS.flatMap((format) => Object.keys(SETTINGS).map((setting) => {
      const cell = row.cells[format][setting];
      // One line per count, so that eight columns of them fit beside the sidebar; the
      // separators are hidden (style.css) and keep the cell's text "0: x · sub: y · over: z".
      const parts = [`0: ${cell.to_zero}`, `sub: ${cell.subnormal}`, `over: ${cell.overflow}`];
      return html('td', {attrs: {'data-format': format, 'data-setting': setting}},
        parts.flatMap((text, i) => [
          ...(i ? [html('span', {className: 'separator', text: ' · '})] : []),
          html('span', {className: 'count', text}),
        ]));
    })),
  ])));
  container.replaceChildren(
    html('h3', {text: 'Precision headroom'}),
    html('p', {className: 'hint', text:
      'Share of each tensor\'s finite non-zero values that a cast would flush to zero (0), make '
      + 'subnormal (sub) or overflow (over): as the values are (gradients at the run\'s loss '
      + 'scale), and scaled per tensor by the power of two that brings its largest magnitude to '
      + 'the format\'s largest value. Rows the underflow or overflow flag marks are highlighted.'}),
    // Narrower than the table (a narrow window), the table scrolls in its box, not the page.
    html('div', {className: 'precision-scroll'}, [html('table', {className: 'precision-table'}, [head, body])]),
    ...blockTable(layerSnapshot),
  );
}
