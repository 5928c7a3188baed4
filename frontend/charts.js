// The pieces every chart of the tab is drawn from: a frame with a plot area,
// a value axis, a log axis with its row of exact zeros, the update-ratio
// guide, signed bars with their magnitude axis, and a step axis. The views
// compose them; the numbers behind them come from model.js and flowmodel.js.

import {UPDATE_RATIO_NOTE} from './captions.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {round, svg, textWidth, tooltip} from './dom.js';

// Labels sit this far below the plot, and axis titles this far above the bottom edge.
const TICK_LABEL_OFFSET = 13;
const STEP_LABEL_OFFSET = 16;
const AXIS_TITLE_OFFSET = 4;

/**
 * A chart's geometry: `size` gives the width and height and the margins
 * around the plot area (`left`, `right`, `top`, `bottom`, in SVG units).
 */
export function chartBox(size) {
  const plotWidth = size.width - size.left - size.right;
  const plotHeight = size.height - size.top - size.bottom;
  return {...size, plotWidth, plotHeight, plotRight: size.left + plotWidth, baseline: size.top + plotHeight};
}

/** An empty SVG chart of the box's size; `label` names it for screen readers (null: hidden from them). */
export function chartFrame(box, {className, label}) {
  const attrs = {viewBox: `0 0 ${box.width} ${box.height}`};
  if (label === null) attrs['aria-hidden'] = 'true';
  else Object.assign(attrs, {role: 'img', 'aria-label': label});
  return svg('svg', {className, attrs});
}

/** A line of text in the middle of a chart with nothing to draw. */
export function emptyMessage(chart, box, text) {
  chart.append(svg('text', {className: 'empty-text', text,
    attrs: {x: box.width / 2, y: box.height / 2, 'text-anchor': 'middle'}}));
}

/**
 * Horizontal gridlines with their labels left of the plot, at `ticks` placed
 * by `yOf`. A tick past `max` is dropped, except the first (the axis' origin).
 */
export function valueAxis(chart, box, {ticks, max, yOf, label}) {
  ticks.forEach((tick, i) => {
    if (i > 0 && tick > max * 1.0001) return;
    const y = round(yOf(tick));
    chart.append(
      svg('line', {className: 'gridline', attrs: {x1: box.left, x2: box.plotRight, y1: y, y2: y}}),
      svg('text', {className: 'tick', text: label(tick), attrs: {x: box.left - 4, y: y + 3, 'text-anchor': 'end'}}),
    );
  });
}

/** A share axis, 0 to 100 %: gridlines at `ticks` (shares from 0 to 1) placed by `yOf`. */
export function shareAxis(chart, box, {ticks, yOf}) {
  valueAxis(chart, box, {ticks, max: 1, yOf, label: (tick) => `${tick * 100} %`});
}

/** A title centred under the plot. */
export function axisTitle(chart, box, text) {
  chart.append(svg('text', {className: 'axis-title', text,
    attrs: {x: box.left + box.plotWidth / 2, y: box.height - AXIS_TITLE_OFFSET, 'text-anchor': 'middle'}}));
}

// The tab's font, as the charts' text inherits it (style.css).
const FONT_FAMILY = 'Roboto, system-ui, sans-serif';

/**
 * A label on a box of the page's background, so that the lines drawn under it do not cross its
 * letters: the box, then the text, appended to `chart`. `x`, `y` and `anchor` place the text as
 * its attributes do; `size` is its font size in pixels (the CSS of `className` must agree).
 */
export function boxedLabel(chart, {text, x, y, anchor = 'start', size, className, title}) {
  const width = textWidth(text, `${size}px ${FONT_FAMILY}`) + 4;
  const left = anchor === 'end' ? x - width + 2 : anchor === 'middle' ? x - width / 2 : x - 2;
  chart.append(
    svg('rect', {className: 'label-backdrop', attrs: {x: round(left), y: round(y - size), width: round(width),
      height: round(size + 3)}}),
    svg('text', {className, text, attrs: {x, y, 'text-anchor': anchor}}, title ? [tooltip(title)] : []),
  );
}

/**
 * A horizontal guide across the plot at `y` (a reference value, not data):
 * its label at the right end above it, `title` on hover.
 */
export function guideLine(chart, box, {y, label, title}) {
  const at = round(y);
  chart.append(
    svg('line', {className: 'guide', attrs: {x1: box.left, x2: box.plotRight, y1: at, y2: at}}, [tooltip(title)]));
  boxedLabel(chart, {text: label, x: box.plotRight - 2, y: at - 3, anchor: 'end', size: 10, className: 'guide-label'});
}

// ------------------------------------------------------------ log axis

/**
 * Where a value goes on a log axis over `range` (decade exponents,
 * `flowmodel.logRange`) that rises `height` from `bottom`: exact zeros,
 * which a log axis cannot hold, go on the row at `zeroY` below it.
 */
export function logScale(range, {bottom, height, zeroY}) {
  return (value) => (value === 0 ? zeroY : bottom - flowmodel.logPosition(value, range) * height);
}

/**
 * A log value axis: gridlines at decades (at most `maxTicks`, none without a
 * `range`) placed by `yOf`, and when `zeros`, the row of exact zeros at
 * `zeroY` with its "0".
 */
export function logAxis(chart, box, {range, yOf, zeroY, zeros, maxTicks}) {
  if (range) {
    valueAxis(chart, box, {ticks: flowmodel.decadeTicks(range, maxTicks).map((e) => 10 ** e),
      max: 10 ** range.high, yOf, label: model.edgeLabel});
  }
  if (zeros) {
    chart.append(
      svg('line', {className: 'zero-line', attrs: {x1: box.left, x2: box.plotRight, y1: zeroY, y2: zeroY}}),
      svg('text', {className: 'tick', text: '0', attrs: {x: box.left - 4, y: zeroY + 3, 'text-anchor': 'end'}}),
    );
  }
}

/** The update ratio practitioners call healthy (~1e-3) as a guide across a log axis placed by `yOf`. */
export function updateRatioGuide(chart, box, yOf) {
  guideLine(chart, box, {y: yOf(model.UPDATE_RATIO_GUIDE), label: '10⁻³: usual size', title: UPDATE_RATIO_NOTE});
}

// ------------------------------------------------------------ signed bars

/**
 * Where the bars of `model.signedBars` go: `count` equal slots across the
 * plot, negative magnitudes left of a `gap` that stands for zero, positive
 * right of it.
 */
export function signedSlots(box, count, gap) {
  const barWidth = (box.plotWidth - gap) / count;
  const half = count / 2;
  return {
    barWidth, half, gap,
    xOf: (i) => box.left + i * barWidth + (i >= half ? gap : 0),
    zeroX: box.left + half * barWidth + gap / 2,
  };
}

/**
 * Draws signed bars up from the baseline, `heightOf(bar)` high. Several
 * series share each slot side by side: this is series `series` of
 * `seriesCount`. `spacing` is left empty between neighbouring bars.
 */
export function drawSignedBars(chart, box, slots, bars, {
  heightOf, title, className = (bar) => (bar.sign < 0 ? 'negative' : 'positive'),
  series = 0, seriesCount = 1, spacing = 1,
}) {
  const width = slots.barWidth / seriesCount;
  bars.forEach((bar, i) => {
    if (!(bar.count > 0)) return;
    const height = heightOf(bar);
    chart.append(svg('rect', {className: `bar ${className(bar)}`, attrs: {
      x: round(slots.xOf(i) + series * width + spacing / 2), y: round(box.baseline - height),
      width: round(Math.max(width - spacing, 0.5)), height: round(height)},
    }, [tooltip(title(bar))]));
  });
}

/** The axis under signed bars: "0" in the gap, decade labels mirrored on both sides. */
export function magnitudeAxis(chart, box, slots, bins, range) {
  const {baseline} = box;
  chart.append(
    svg('line', {className: 'axis', attrs: {x1: box.left, x2: box.plotRight, y1: baseline, y2: baseline}}),
    svg('text', {className: 'tick', text: '0', attrs: {x: slots.zeroX, y: baseline + TICK_LABEL_OFFSET, 'text-anchor': 'middle'}}),
  );
  for (const {x, label} of magnitudeTicks(bins, range, box, slots)) {
    chart.append(
      svg('line', {className: 'axis', attrs: {x1: x, x2: x, y1: baseline, y2: baseline + 3}}),
      svg('text', {className: 'tick', text: label, attrs: {x, y: baseline + TICK_LABEL_OFFSET, 'text-anchor': 'middle'}}),
    );
  }
}

/**
 * Decade labels on both sides of the zero gap, thinned to about four a side.
 * Bars are contiguous on each side: the boundary `k` bins away from the gap
 * is at the same distance from it on both sides.
 */
function magnitudeTicks(bins, range, {left}, {half, barWidth, gap}) {
  const decades = [];
  for (let offset = 0; offset <= range.last - range.first + 1; offset++) {
    const bin = range.first + offset;
    const edge = bin <= range.last ? bins[bin].low : bins[range.last].high;
    // The innermost boundary is left to the "0" label, which it would overlap.
    if (offset > 0 && edge > 0 && Number.isFinite(edge) && model.isDecade(edge)) decades.push({offset, edge});
  }
  const every = Math.max(1, Math.ceil(decades.length / 4));
  const ticks = [];
  decades.forEach(({offset, edge}, i) => {
    if ((decades.length - 1 - i) % every !== 0) return;
    const label = model.edgeLabel(edge);
    ticks.push({x: round(left + (half + offset) * barWidth + gap), label});
    ticks.push({x: round(left + (half - offset) * barWidth), label: `−${label}`});
  });
  return ticks;
}

// ------------------------------------------------------------ bands

/**
 * A band over columns: column `k` spans `xOf(k)` to `xOf(k + 1)` and
 * `lowY(k)` to `highY(k)`; a column where either is not finite breaks the band.
 * One path, however many columns.
 */
export function drawBand(chart, {count, xOf, lowY, highY, className}) {
  const paths = [];
  let top = [];
  let bottom = [];
  const close = () => {
    if (top.length) paths.push(`M${top.join('L')}L${bottom.reverse().join('L')}Z`);
    top = [];
    bottom = [];
  };
  for (let k = 0; k < count; k++) {
    const low = lowY(k);
    const high = highY(k);
    if (!(Number.isFinite(low) && Number.isFinite(high))) {
      close();
      continue;
    }
    const [x0, x1] = [round(xOf(k)), round(xOf(k + 1))];
    top.push(`${x0},${round(high)}`, `${x1},${round(high)}`);
    bottom.push(`${x0},${round(low)}`, `${x1},${round(low)}`);
  }
  close();
  chart.append(svg('path', {className, attrs: {d: paths.join('')}}));
}

// ------------------------------------------------------------ step axis

/** The x axis of a chart over `steps` (sorted): its `first` and `last` step, and `xOf(step)` (one step: the middle). */
export function stepScale(box, steps) {
  const first = steps[0];
  const last = steps[steps.length - 1];
  const xOf = (s) => box.left + (last > first ? (s - first) / (last - first) : 0.5) * box.plotWidth;
  return {first, last, xOf};
}

/**
 * The steps under the plot, the axis title, and a vertical line at
 * `currentX` (null: none) marking `currentStep`. The steps are the `first`
 * and `last` at the plot's ends, or, given `ticks` (`{step, x}`), a tick
 * and a label at each.
 */
export function stepAxis(chart, box, {first, last, currentX = null, currentStep, ticks = null}) {
  const y = box.height - STEP_LABEL_OFFSET;
  if (currentX !== null) {
    const x = round(currentX);
    chart.append(svg('line', {className: 'current-step', attrs: {x1: x, x2: x, y1: box.top, y2: box.baseline}},
      [tooltip(`step ${currentStep}`)]));
  }
  if (ticks) {
    const {baseline} = box;
    chart.append(svg('line', {className: 'axis', attrs: {x1: box.left, x2: box.plotRight, y1: baseline, y2: baseline}}));
    for (const {step, x} of ticks) {
      const at = round(x);
      chart.append(
        svg('line', {className: 'axis', attrs: {x1: at, x2: at, y1: baseline, y2: baseline + 4}}),
        svg('text', {className: 'tick step-tick', text: String(step),
          attrs: {x: at, y, 'text-anchor': 'middle', 'data-step': step}}),
      );
    }
  } else {
    chart.append(
      svg('text', {className: 'tick', text: String(first), attrs: {x: box.left, y}}),
      svg('text', {className: 'tick', text: String(last), attrs: {x: box.plotRight, y, 'text-anchor': 'end'}}),
    );
  }
  axisTitle(chart, box, 'step');
}
