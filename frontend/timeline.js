// The depth x time view: one canvas row per layer (model order), one column
// per column of /timeline (about one per pixel), coloured by the chosen
// field, flags marked. Hover says the values; click opens that layer at that step.

import {html} from './dom.js';
import * as timelinemodel from './timelinemodel.js';

const ROW_HEIGHT = 6;
const MIN_ROW_HEIGHT = 2;
const MAX_HEIGHT = 720;
const FLAG_COLOURS = {nonfinite: [255, 0, 255], exploding: [255, 64, 0], vanishing: [0, 200, 255], dead: [0, 0, 0]};

/**
 * Draws `matrix` (timelinemodel.timelineMatrix or differenceMatrix) into `container`.
 *
 * @param {HTMLElement} container emptied and filled
 * @param {object} matrix the rows, columns and colour range
 * @param {{width: number, onSelect: function(string, number): void}} options
 *   the drawing's width in CSS pixels, and what a click on a cell does (layer, step)
 * @returns {HTMLCanvasElement} the canvas
 */
export function renderTimeline(container, matrix, {width, onSelect}) {
  const rowHeight = Math.max(MIN_ROW_HEIGHT, Math.min(ROW_HEIGHT, Math.floor(MAX_HEIGHT / Math.max(1, matrix.rows.length))));
  const height = Math.max(1, rowHeight * matrix.rows.length);
  const canvas = html('canvas', {className: 'timeline-canvas', attrs: {
    width: String(Math.max(1, Math.round(width))), height: String(height),
    'data-rows': String(matrix.rows.length), 'data-columns': String(matrix.columns.first_step.length),
    role: 'img', 'aria-label': `${timelinemodel.FIELD_TITLES[matrix.field] ?? matrix.field} of ${matrix.rows.length} layers `
      + `over ${matrix.columns.first_step.length} columns of steps`,
  }});
  // One canvas pixel per CSS pixel across; rows are whole pixels tall.
  Object.assign(canvas.style, {display: 'block', width: '100%', height: `${height}px`, imageRendering: 'pixelated',
    cursor: 'pointer'});
  const tip = html('div', {className: 'timeline-tip', attrs: {role: 'status'}});
  container.replaceChildren(html('div', {className: 'timeline-scale'}, scaleLegend(matrix)), canvas, tip);
  draw(canvas, matrix, rowHeight);
  const cellOf = (event) => {
    const box = canvas.getBoundingClientRect();
    return timelinemodel.cellAt(matrix, box.width, box.height, event.clientX - box.left, event.clientY - box.top);
  };
  canvas.addEventListener('mousemove', (event) => {
    const cell = cellOf(event);
    tip.textContent = cell ? timelinemodel.describeCell(matrix, cell) : '';
  });
  canvas.addEventListener('mouseleave', () => {
    tip.textContent = '';
  });
  canvas.addEventListener('click', (event) => {
    const cell = cellOf(event);
    if (cell && onSelect) onSelect(matrix.rows[cell.row].layer, matrix.columns.last_step[cell.column]);
  });
  return canvas;
}

function draw(canvas, matrix, rowHeight) {
  const context = canvas.getContext('2d');
  const {width, height} = canvas;
  const columns = matrix.columns.first_step.length;
  const image = context.createImageData(width, height);
  const rows = matrix.rows.length;
  if (rows === 0) return; // nothing to colour (timelinemodel.timelineView says why)
  // Each pixel takes the cell under it: one pass over the pixels, whatever the number of steps.
  const columnOfX = Array.from({length: width}, (_, x) => Math.min(columns - 1, Math.floor((x / width) * columns)));
  for (let y = 0; y < height; y++) {
    const r = Math.min(rows - 1, Math.floor((y / height) * rows));
    const row = matrix.rows[r];
    // The top third of a row's band shows its flags, the rest its value.
    const flagBand = (y % rowHeight) < Math.max(1, Math.floor(rowHeight / 3));
    for (let x = 0; x < width; x++) {
      const c = columnOfX[x];
      const flags = row.flags[c];
      let colour = flagBand && flags.length ? FLAG_COLOURS[flags[0]]
        : timelinemodel.colourOf(row.values[c], matrix.low, matrix.high, matrix.diverging);
      if (colour === null) colour = [200, 200, 200];
      const at = (y * width + x) * 4;
      image.data[at] = colour[0];
      image.data[at + 1] = colour[1];
      image.data[at + 2] = colour[2];
      image.data[at + 3] = 255;
    }
  }
  context.putImageData(image, 0, 0);
}

function scaleLegend(matrix) {
  const title = timelinemodel.FIELD_TITLES[matrix.field] ?? matrix.field;
  const range = `${matrix.diverging ? 'A - B, ' : ''}${title}: ${matrix.low.toPrecision(3)} (${matrix.diverging ? 'blue' : 'dark'}) `
    + `to ${matrix.high.toPrecision(3)} (${matrix.diverging ? 'red' : 'yellow'}); grey: no value`;
  const flags = 'flags: magenta non-finite, orange exploding, cyan vanishing, black dead channels';
  return [html('span', {text: range}), html('span', {className: 'timeline-flags', text: flags})];
}
