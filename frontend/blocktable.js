// The block-format table of the precision panel: per tensor of the layer and
// block-scaled format, the shares blockformats.js words and the server's
// verdict whether the tensor survives the format. DOM only.

import * as blockformats from './blockformats.js';
import {html} from './dom.js';

export const NO_BLOCK_PART = 'No block-format counts at this step: the precision records were written '
  + 'before tb_gradviz recorded them (or with block_formats=False).';

const HINT = 'What a block-scaled format would do to each tensor as captured (gradients at the run\'s '
  + 'loss scale): blocks of consecutive values along the last axis (32, NVFP4 16) share one scale. '
  + 'Shares of the tensor\'s finite non-zero values that become zero (0), subnormal (sub) or saturate '
  + '(sat); the share of blocks whose own range is wider than the element\'s (wide); the relative squared '
  + 'error of the quantized tensor (err). A tensor survives a format when at most 1 % of its non-zero '
  + 'values become zero. Hover a cell for the counts.';

/**
 * The block part of the precision panel for a layer's /step entry: a heading, a hint and the
 * table, or a one-line note when no tensor's record has the block part (an older run).
 *
 * @returns {Element[]}
 */
export function blockTable(layerSnapshot) {
  const rows = blockformats.blockRows(layerSnapshot);
  if (!rows.length) return [html('p', {className: 'hint block-note', text: NO_BLOCK_PART})];
  const {BLOCK_FORMATS, BLOCK_FORMAT_NAMES, BLOCK_SIZES} = blockformats;
  const head = html('thead', {}, [html('tr', {}, [
    html('th', {text: 'tensor', attrs: {scope: 'col'}}),
    ...BLOCK_FORMATS.map((format) => html('th', {attrs: {scope: 'col', 'data-format': format}}, [
      html('span', {className: 'format-name', text: BLOCK_FORMAT_NAMES[format]}),
      html('span', {className: 'block-size', text: ` · ${BLOCK_SIZES[format]}`}),
    ])),
  ])]);
  const body = html('tbody', {}, rows.map((row) => html('tr', {attrs: {'data-tensor': row.tensor}}, [
    html('th', {text: row.tensor, attrs: {scope: 'row'}}),
    ...BLOCK_FORMATS.map((format) => {
      const cell = row.cells[format];
      const verdict = cell.survives === true ? 'survives' : cell.survives === false ? 'fails' : 'unjudged';
      return html('td', {className: verdict, attrs: {'data-format': format, title: cell.title}}, [
        html('span', {className: 'verdict', text: cell.verdict}),
        ...cell.lines.map(({share, text}) => html('span', {className: 'count', text, attrs: {'data-share': share}})),
      ]);
    }),
  ])));
  return [
    html('h4', {text: 'Block-scaled formats'}),
    html('p', {className: 'hint', text: HINT}),
    html('div', {className: 'precision-scroll'}, [html('table', {className: 'block-table'}, [head, body])]),
  ];
}
