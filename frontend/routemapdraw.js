// Canvas painting of the routing map (routemap.js lays it out): cells shaded
// by value with exact zeros striped, the pooling windows outlined, winners and
// ties marked. A canvas, not SVG: a cropped 112x112 map has thousands of
// cells and windows. Colours are the stylesheet's variables, resolved through
// a probe element, since a canvas cannot read light-dark().

import {linearShade, logShade} from './routemapmodel.js';

const INKS = ['text', 'muted', 'background', 'surface', 'positive', 'negative', 'zeros', 'accent', 'alarm', 'tie',
  'window', 'window-alt'];

/** The stylesheet's colours as `[r, g, b, a]` (0..255, alpha 0..1), as the theme now resolves them. */
export function resolveInks(host) {
  const probe = document.createElement('span');
  probe.style.position = 'absolute';
  probe.style.visibility = 'hidden';
  host.append(probe);
  const inks = {};
  for (const name of INKS) {
    probe.style.color = `var(--${name})`;
    const parts = getComputedStyle(probe).color.match(/[\d.]+/g)?.map(Number) ?? [0, 0, 0];
    inks[name] = [parts[0], parts[1], parts[2], parts[3] ?? 1];
  }
  probe.remove();
  return inks;
}

const css = ([r, g, b, a], alpha = a) => `rgba(${r}, ${g}, ${b}, ${alpha})`;

/** A canvas of `width` x `height` CSS pixels, sharp on high-density screens. */
export function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const context = canvas.getContext('2d');
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, width, height);
  return context;
}

/** Stripes for exact zeros, as the mass bar of the panels stripes them. */
function zeroPattern(context, inks) {
  const tile = document.createElement('canvas');
  tile.width = tile.height = 6;
  const ctx = tile.getContext('2d');
  ctx.fillStyle = css(inks.surface);
  ctx.fillRect(0, 0, 6, 6);
  ctx.strokeStyle = css(inks.zeros, 0.8);
  ctx.lineWidth = 1.2;
  ctx.beginPath();
  ctx.moveTo(-1, 7);
  ctx.lineTo(7, -1);
  ctx.stroke();
  return context.createPattern(tile, 'repeat');
}

/**
 * Shades `values` (row-major, `cols` a row) as cells of `cell` pixels:
 * positive and negative in their colours by `scale` ('linear' or 'log' of
 * |v| / max), exact zeros striped, non-finite values in the alarm colour.
 */
export function paintCells(context, {values, cols, cell, max, scale, inks}) {
  const rows = Math.ceil(values.length / cols);
  const shade = scale === 'log' ? logShade : linearShade;
  const tile = document.createElement('canvas');
  tile.width = cols;
  tile.height = rows;
  const tileContext = tile.getContext('2d');
  const image = tileContext.createImageData(cols, rows);
  const zeros = new Path2D();
  const [br, bg, bb] = inks.background;
  values.forEach((v, i) => {
    let colour;
    if (v === 0) {
      zeros.rect((i % cols) * cell, Math.floor(i / cols) * cell, cell, cell);
      colour = inks.surface;
    } else if (!Number.isFinite(v)) {
      colour = inks.alarm;
    } else {
      const [r, g, b] = v < 0 ? inks.negative : inks.positive;
      const t = shade(v, max);
      colour = [br + (r - br) * t, bg + (g - bg) * t, bb + (b - bb) * t];
    }
    image.data.set([colour[0], colour[1], colour[2], 255], i * 4);
  });
  tileContext.putImageData(image, 0, 0);
  context.imageSmoothingEnabled = false;
  context.drawImage(tile, 0, 0, cols * cell, rows * cell);
  context.fillStyle = zeroPattern(context, inks);
  context.fill(zeros);
}

/**
 * Outlines each window a little inside its cells, in two colours like a
 * checkerboard of windows: where windows overlap (3x3 with stride 2) the
 * outlines of neighbours cross inside the shared row or column; where they
 * only touch (2x2 with stride 2) a gap shows between them. Tied windows are
 * tinted and dashed in the tie colour. Below 6 px a cell, outlines would
 * hide the cells: only the tint is drawn.
 */
export function paintWindows(context, {layout, tied, cell, inks}) {
  const inset = Math.max(1, cell * 0.18);
  const paths = [new Path2D(), new Path2D()];
  const dashed = new Path2D();
  const tint = new Path2D();
  for (const rect of layout.rects) {
    const isTied = tied[rect.index] === true;
    if (isTied) tint.rect(rect.left * cell, rect.top * cell, rect.width * cell, rect.height * cell);
    if (cell < 6) continue;
    const path = isTied ? dashed : paths[(rect.row + rect.col) % 2];
    path.rect(rect.left * cell + inset, rect.top * cell + inset,
      rect.width * cell - 2 * inset, rect.height * cell - 2 * inset);
  }
  // One path: where tied windows overlap the tint is no darker.
  context.fillStyle = css(inks.tie, 0.16);
  context.fill(tint);
  context.lineWidth = 1;
  context.strokeStyle = css(inks.window);
  context.stroke(paths[0]);
  context.strokeStyle = css(inks['window-alt']);
  context.stroke(paths[1]);
  context.setLineDash([Math.max(2, cell * 0.3), Math.max(2, cell * 0.2)]);
  context.lineWidth = 1.5;
  context.strokeStyle = css(inks.tie);
  context.stroke(dashed);
  context.setLineDash([]);
}

function dot(path, cell, index, cols, radius) {
  const x = (index % cols + 0.5) * cell;
  const y = (Math.floor(index / cols) + 0.5) * cell;
  path.moveTo(x + radius, y);
  path.arc(x, y, radius, 0, 2 * Math.PI);
}

/** Marks each window's winner with a dot, larger where several windows chose the same position. */
export function paintWinners(context, {routing, cols, cell, inks}) {
  const dots = new Path2D();
  routing.routedFrom.forEach((count, i) => {
    if (count > 0) dot(dots, cell, i, cols, Math.max(1.2, cell * (count > 1 ? 0.3 : 0.22)));
  });
  context.fillStyle = css(inks.text);
  context.fill(dots);
  if (cell >= 6) {
    context.lineWidth = 1;
    context.strokeStyle = css(inks.background);
    context.stroke(dots);
  }
}

/** Outlines cells (the positions where the backend's gradient differs from the rule's). */
export function paintCellOutlines(context, {indices, cols, cell, inks}) {
  context.lineWidth = 2;
  context.strokeStyle = css(inks.alarm);
  for (const i of indices) context.strokeRect((i % cols) * cell + 1, Math.floor(i / cols) * cell + 1, cell - 2, cell - 2);
}

/**
 * The hovered window: its cells outlined in the accent colour, its winner
 * ringed, and, when tied, the other positions holding its maximum ringed in
 * the tie colour.
 */
export function paintHighlight(context, {rect, winner, tiedAt = [], cols, cell, inks}) {
  context.lineWidth = 2.5;
  context.strokeStyle = css(inks.accent);
  context.strokeRect(rect.left * cell, rect.top * cell, rect.width * cell, rect.height * cell);
  if (winner >= 0) {
    const ring = new Path2D();
    dot(ring, cell, winner, cols, Math.max(3, cell * 0.42));
    context.lineWidth = 2;
    context.stroke(ring);
  }
  const others = new Path2D();
  for (const i of tiedAt.slice(1)) dot(others, cell, i, cols, Math.max(2, cell * 0.3));
  context.lineWidth = 1.5;
  context.strokeStyle = css(inks.tie);
  context.stroke(others);
}
