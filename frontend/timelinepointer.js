// The pointer over the depth x time view: a crosshair through the cell under
// it, a reading that names its layer, steps, value and flags, its row's name
// lit; a click opens that layer at that step, a drag across steps zooms to them.

import {html} from './dom.js';
import * as layout from './timelinelayout.js';
import * as timelinemodel from './timelinemodel.js';

// A press that moves less than this (CSS pixels) is a click, not a drag.
const DRAG_PIXELS = 4;
// The reading sits this far from the pointer.
const TIP_OFFSET = 14;

/**
 * Follows the pointer over `canvas` (in `plot`, in `view`), whose rows are `matrix.rows`
 * named by the items of `names`.
 *
 * @param {object} parts `view`, `canvas`, `plot`, `names`, `matrix`, `onsets` (those marked, which
 *   the reading of their cell names), `onSelect(layer, step)`, `onZoom({start, end})`
 */
export function followPointer({view, canvas, plot, names, matrix, onsets = [], onSelect, onZoom}) {
  const vertical = html('div', {className: 'timeline-cross vertical', attrs: {hidden: ''}});
  const horizontal = html('div', {className: 'timeline-cross horizontal', attrs: {hidden: ''}});
  const band = html('div', {className: 'timeline-selection', attrs: {hidden: ''}});
  const tip = html('div', {className: 'timeline-tip', attrs: {role: 'status', hidden: ''}});
  plot.append(vertical, horizontal, band);
  view.append(tip);
  const columns = matrix.columns.first_step.length;
  let lit = null;
  let press = null; // {x, pointerId, dragging}
  let dragged = false;

  const local = (event) => {
    const box = canvas.getBoundingClientRect();
    return {x: event.clientX - box.left, y: event.clientY - box.top, box};
  };
  const light = (row) => {
    if (lit !== null) names.children[lit]?.classList.remove('current');
    lit = row;
    if (row !== null) names.children[row]?.classList.add('current');
  };
  const hide = () => {
    for (const element of [vertical, horizontal, tip]) element.hidden = true;
    light(null);
  };
  const show = (event) => {
    const {x, y, box} = local(event);
    const cell = timelinemodel.cellAt(matrix, box.width, box.height, x, y);
    if (!cell) return hide();
    const rowHeight = box.height / matrix.rows.length;
    vertical.style.left = `${((cell.column + 0.5) / columns) * 100}%`;
    horizontal.style.top = `${(cell.row + 0.5) * rowHeight}px`;
    vertical.hidden = horizontal.hidden = false;
    light(cell.row);
    tip.textContent = timelinemodel.describeCell(matrix, cell) + onsetsIn(matrix, onsets, cell);
    tip.hidden = false;
    // Beside the pointer, on the side with room.
    const within = view.getBoundingClientRect();
    const px = event.clientX - within.left;
    const py = event.clientY - within.top;
    const right = px + TIP_OFFSET + tip.offsetWidth <= within.width;
    tip.style.left = `${right ? px + TIP_OFFSET : Math.max(0, px - TIP_OFFSET - tip.offsetWidth)}px`;
    tip.style.top = `${py + TIP_OFFSET}px`;
  };

  canvas.addEventListener('pointermove', (event) => {
    show(event);
    if (!press) return;
    const {x, box} = local(event);
    if (!press.dragging && Math.abs(x - press.x) < DRAG_PIXELS) return;
    press.dragging = true;
    const [from, to] = [Math.max(0, Math.min(press.x, x)), Math.min(box.width, Math.max(press.x, x))];
    band.style.left = `${(from / box.width) * 100}%`;
    band.style.width = `${((to - from) / box.width) * 100}%`;
    band.hidden = false;
  });
  canvas.addEventListener('pointerleave', () => {
    if (!press) hide();
  });
  canvas.addEventListener('pointerdown', (event) => {
    if (event.button !== 0) return;
    press = {x: local(event).x, pointerId: event.pointerId, dragging: false};
    canvas.setPointerCapture(event.pointerId);
  });
  const release = (event) => {
    if (!press) return;
    const {x, box} = local(event);
    const {dragging} = press;
    const from = press.x;
    press = null;
    band.hidden = true;
    dragged = dragging;
    if (dragging && onZoom) onZoom(layout.dragRange(matrix.columns, box.width, from, x));
  };
  canvas.addEventListener('pointerup', release);
  canvas.addEventListener('pointercancel', () => {
    press = null;
    band.hidden = true;
  });
  canvas.addEventListener('click', (event) => {
    if (dragged) {
      dragged = false;
      return;
    }
    const {x, y, box} = local(event);
    const cell = timelinemodel.cellAt(matrix, box.width, box.height, x, y);
    if (cell && onSelect) onSelect(matrix.rows[cell.row].layer, matrix.columns.last_step[cell.column]);
  });
}

// What the reading adds for the onsets in a cell: '; exploding began here (step 120)', '; warning
// rms_growth began here (step 118)'.
function onsetsIn(matrix, onsets, {row, column}) {
  const layer = matrix.rows[row].layer;
  const [first, last] = [matrix.columns.first_step[column], matrix.columns.last_step[column]];
  return onsets.filter((onset) => onset.layer === layer && first <= onset.step && onset.step <= last)
    .map((onset) => `; ${onset.class === 'warning' ? 'warning ' : ''}${onset.flag} began here (step ${onset.step})`)
    .join('');
}
