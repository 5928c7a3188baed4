// DOM of the gradient-flow view: every layer of a run in model order along x,
// and per role a log panel of the RMS and largest |value| with a strip of the
// exact-zero share below it (and, for a gradient with a precision record, the
// share that flushes to zero in float16 or the format the layer computes in);
// one line per chosen step and run; the training-health flags of /step as
// badges above; with weights=True a panel of the weight gradients and one of
// each layer's update ratio below. The numbers come from flowmodel.js.

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {html, round, svg, textWidth, tooltip} from './dom.js';

// The plot's left edge: at least this far in, and past the longest flag row's label.
const MIN_LEFT = 74;
const FLAG_LABEL_FONT = '10px Roboto, system-ui, sans-serif'; // flow.css' .flag-row-label
const FLAG_LABEL_GAP = 6;
const RIGHT = 14;
const FLAG_ROW = 11;
const TITLE_HEIGHT = 18;
const LOG_HEIGHT = 112;
const UPDATE_HEIGHT = 84;
// Exact zeros have no place on a log axis: they sit on a row of their own below it.
const ZERO_ROW = 14;
const ZEROS_GAP = 12;
const ZEROS_HEIGHT = 28;
const PANEL_GAP = 14;
const LABEL_GAP = 6;
const LABEL_CHAR_WIDTH = 7.4; // of an 11 px label, at most about (bold for the current layer)
const MAX_LABEL_HEIGHT = 180;
// Narrower than this, the chart grows wider than its box and scrolls.
const MIN_SLOT_WIDTH = 4;
// Layer names closer than this are thinned out (full names are on hover).
const LABEL_SPACING = 12;
const POINT_RADIUS = 1.8;

const STAT_TITLES = {rms: 'RMS', max_abs: 'max |value|', zero_fraction: 'exact zeros', update_ratio: 'update ratio',
  flush: 'share that flushes to zero'};
// The update-ratio panel's points carry this role.
const UPDATE_ROLE = 'update';

/**
 * Draws the view into `container`.
 *
 * @param {object} view
 * @param {{primary: ?string, other: ?string}[]} view.slots the x axis (`flowmodel.alignLayers`).
 * @param {object[]} view.lines `{run, step, series, pin, side, snapshot}`: `series` 0 for the
 *   view's run and 1 for the overlaid one, `pin` 0 for the slider's step and 1.. for kept steps.
 * @param {?string} view.currentLayer the layer of the layer view, highlighted.
 * @param {number} view.width the width to fill, in pixels.
 * @param {function(string)} view.onSelect called with a layer of the view's run when it is clicked.
 * @param {string[]} view.roles the roles with a panel (`flowmodel.flowRoles`).
 * @param {boolean} view.updates whether to draw the update-ratio panel (`flowmodel.hasUpdates`).
 */
export function renderFlow(container, {slots, lines, currentLayer, width, onSelect,
  roles = flowmodel.FLOW_ROLES, updates = false}) {
  if (slots.length === 0 || lines.length === 0) {
    container.replaceChildren(html('p', {className: 'empty', text: 'No layer logged at or before this step.'}));
    return;
  }
  const drawn = lines.map((line) => ({...line, names: slots.map((slot) => slot[line.side]),
    layers: new Map(line.snapshot.layers.map((layer) => [layer.layer, layer])),
    values: flowmodel.flowLine(line.snapshot, slots, line.side, roles),
    flush: flowmodel.flushLine(line.snapshot, slots, line.side, roles),
    ratios: updates ? flowmodel.updateRatioLine(line.snapshot, slots, line.side) : null,
    flags: flowmodel.slotFlags(line.snapshot, slots, line.side)}));
  const labels = flowmodel.shortLayerNames(slots.map(flowmodel.slotName));
  const current = drawn.filter(({pin}) => pin === 0);
  const geometry = layout(slots.length, width, current.length, labels, roles.length, updates);
  const {xOf} = geometry;
  const chart = charts.chartFrame({width: geometry.width, height: geometry.height},
    {className: 'flow-chart', label: `gradient flow over ${slots.length} layers`});
  // One SVG unit per pixel, so that text keeps its size however many layers there are.
  chart.style.width = `${geometry.width}px`;
  chart.style.height = `${geometry.height}px`;

  const currentSlot = slots.findIndex((slot) => slot.primary !== null && slot.primary === currentLayer);
  chart.append(...slots.map((slot, k) => {
    const classes = `flow-hit${k === currentSlot ? ' current' : ''}${slot.primary === null ? ' other-only' : ''}`;
    const hit = svg('rect', {className: classes,
      attrs: {x: round(xOf(k) - geometry.slotWidth / 2), y: 0, width: round(geometry.slotWidth),
        height: geometry.height, 'data-layer': flowmodel.slotName(slot)}},
    [tooltip(slotTitle(slot, labels[k], k, current, roles))]);
    if (slot.primary !== null) hit.addEventListener('click', () => onSelect(slot.primary));
    return hit;
  }));

  current.forEach((line, block) => flagBadges(chart, geometry, line, block, current.length > 1));
  roles.forEach((role, r) => panel(chart, geometry, geometry.panels[r], role, drawn));
  if (updates) updatePanel(chart, geometry, geometry.updatePanel, drawn);
  layerLabels(chart, geometry, labels, slots, currentSlot);

  const parts = [legend(drawn), html('div', {className: 'flow-scroll'}, [chart])];
  // Only with update ratios: replaceChildren would write a null as the text "null".
  if (updates) parts.push(html('p', {className: 'hint flow-update-note', text: captions.UPDATE_RATIO_NOTE}));
  container.replaceChildren(...parts);
}

/** Where everything goes, top to bottom: `roleCount` role panels, then the update-ratio panel if `updates`. */
function layout(count, width, runs, labels, roleCount, updates) {
  // The run's marker (`flagBadges`) and a gap, then the longest label, then the plot.
  const longestFlag = Math.max(...flowmodel.FLAGS.map((flag) => textWidth(captions.FLAG_TITLES[flag], FLAG_LABEL_FONT)));
  const left = Math.max(MIN_LEFT, Math.ceil(10 + longestFlag + FLAG_LABEL_GAP));
  const plotWidth = Math.max(width - left - RIGHT, count * MIN_SLOT_WIDTH);
  const slotWidth = plotWidth / count;
  const flagsHeight = runs * flowmodel.FLAGS.length * FLAG_ROW;
  let y = flagsHeight + 6;
  const panels = Array.from({length: roleCount}, () => {
    const top = y + TITLE_HEIGHT;
    const bottom = top + LOG_HEIGHT;
    const zerosTop = bottom + ZERO_ROW + ZEROS_GAP;
    y = zerosTop + ZEROS_HEIGHT + PANEL_GAP;
    return {titleY: top - 6, top, bottom, zeroY: bottom + ZERO_ROW, zerosTop, zerosBottom: zerosTop + ZEROS_HEIGHT};
  });
  let updatePanel = null;
  if (updates) {
    // No strip of exact zeros: a ratio is one number per layer.
    const top = y + TITLE_HEIGHT;
    const bottom = top + UPDATE_HEIGHT;
    updatePanel = {titleY: top - 6, top, bottom, zeroY: bottom + ZERO_ROW};
    y = bottom + ZERO_ROW + PANEL_GAP;
  }
  const longest = Math.max(...labels.map((label) => label.length));
  const labelTop = y - PANEL_GAP + LABEL_GAP;
  const height = labelTop + Math.min(MAX_LABEL_HEIGHT, longest * LABEL_CHAR_WIDTH) + 6;
  return {
    left, width: left + plotWidth + RIGHT, height, plotRight: left + plotWidth, slotWidth, panels, updatePanel, labelTop,
    xOf: (k) => left + (k + 0.5) * slotWidth,
  };
}

// ------------------------------------------------------------ flags

/** One row per flag, a badge in the column of each layer that raises it; a block per run. */
function flagBadges(chart, geometry, line, block, withRun) {
  const rules = line.snapshot.health?.rules;
  const width = Math.max(2, Math.min(geometry.slotWidth - 1, 12));
  flowmodel.FLAGS.forEach((flag, row) => {
    const y = (block * flowmodel.FLAGS.length + row) * FLAG_ROW;
    chart.append(svg('text', {className: 'flag-row-label', text: captions.FLAG_TITLES[flag],
      attrs: {x: geometry.left - FLAG_LABEL_GAP, y: y + FLAG_ROW - 1.5, 'text-anchor': 'end'}}));
    line.flags.forEach((flags, k) => {
      const raised = flags.find((entry) => entry.flag === flag);
      if (!raised) return;
      chart.append(svg('rect', {className: `flag-badge flag-${flag}`, attrs: {
        x: round(geometry.xOf(k) - width / 2), y: y + 1, width: round(width), height: FLAG_ROW - 2, rx: 1.5,
        'data-layer': line.names[k], 'data-flag': flag, 'data-run': line.run,
      }}, [tooltip(`${line.run}, step ${line.snapshot.step}\n${captions.flagTitle(raised, rules)}`)]));
    });
  });
  if (withRun) {
    const top = block * flowmodel.FLAGS.length * FLAG_ROW;
    chart.append(svg('rect', {className: `flag-block series-${line.series}`,
      attrs: {x: 2, y: top + 1, width: 3, height: flowmodel.FLAGS.length * FLAG_ROW - 2}}, [tooltip(line.run)]));
  }
}

// ------------------------------------------------------------ panels

/** One role: its log panel (RMS solid, max |value| dashed), the zero row, and the strip of exact zeros. */
function panel(chart, geometry, place, role, lines) {
  const lists = lines.flatMap(({values}) => flowmodel.LOG_STATS.map((stat) => values[role][stat]));
  const range = flowmodel.logRange(lists);
  const zeros = flowmodel.hasZero(lists);
  const group = svg('g', {className: 'flow-panel', attrs: {
    'data-role': role, 'data-top': place.top, 'data-bottom': place.bottom, 'data-zero-y': place.zeroY,
    'data-zeros-top': place.zerosTop, 'data-zeros-bottom': place.zerosBottom,
    ...(range && {'data-log-low': range.low, 'data-log-high': range.high}),
  }});
  chart.append(group);
  const box = {left: geometry.left, plotRight: geometry.plotRight};
  const logY = charts.logScale(range, {bottom: place.bottom, height: LOG_HEIGHT, zeroY: place.zeroY});
  const zerosY = (fraction) => place.zerosBottom - fraction * ZEROS_HEIGHT;
  group.append(svg('text', {className: 'panel-title', text: `${captions.ROLE_TITLES[role]}: RMS and max |value|`,
    attrs: {x: geometry.left, y: place.titleY}}));
  if (!range) {
    group.append(svg('text', {className: 'empty-text', text: 'no non-zero finite value',
      attrs: {x: (geometry.left + geometry.plotRight) / 2, y: (place.top + place.bottom) / 2, 'text-anchor': 'middle'}}));
  }
  charts.logAxis(group, box, {range, yOf: logY, zeroY: place.zeroY, zeros});
  charts.shareAxis(group, box, {ticks: [0, 1], yOf: zerosY});
  const flushLabels = flowmodel.flushLabels(lines.map(({flush}) => flush[role]));
  const stripTitle = flushLabels.length ? `exact zeros · dotted: share that ${flushLabels.join(' / ')}` : 'exact zeros';
  group.append(svg('text', {className: 'strip-title', text: stripTitle,
    attrs: {x: geometry.plotRight, y: place.zerosTop - 2, 'text-anchor': 'end'}}));

  // Kept steps first, the slider's step on top of them.
  for (const line of [...lines].sort((a, b) => b.pin - a.pin || b.series - a.series)) {
    const onPanel = range ? flowmodel.drawableOnLogPanel : (value) => value === 0;
    for (const stat of flowmodel.LOG_STATS) draw(group, geometry, line, line.values[role][stat], role, stat, onPanel, logY);
    draw(group, geometry, line, line.values[role].zero_fraction, role, 'zero_fraction', Number.isFinite, zerosY);
    const flush = line.flush[role];
    if (flush) {
      draw(group, geometry, line, flush.map((entry) => entry?.share ?? null), role, 'flush', Number.isFinite, zerosY,
        (k) => ({'data-format': flush[k].format, 'data-flushed': flush[k].flushed, 'data-total': flush[k].total}));
    }
  }
  // Over the lines, its label on a halo of the background.
  if (role === 'output_gradient') thresholds(group, geometry, lines, range, logY);
}

/**
 * One statistic of one line (`values`, one per slot) as a polyline broken at gaps, with a point per layer on the
 * slider's step; `attrsOf(k)`: more attributes of slot k's point.
 */
function draw(group, geometry, line, values, role, stat, drawable, yOf, attrsOf = () => ({})) {
  const classes = `series-${line.series} pin-${line.pin} stat-${stat}`;
  const what = role === UPDATE_ROLE ? STAT_TITLES[stat] : `${captions.ROLE_TITLES[role]}, ${STAT_TITLES[stat]}`;
  const name = `${line.run}, step ${line.snapshot.step}: ${what}`;
  for (const run of flowmodel.drawableRuns(values, drawable)) {
    if (run.length > 1) {
      const d = run.map((k, n) => `${n ? 'L' : 'M'}${round(geometry.xOf(k))},${round(yOf(values[k]))}`).join('');
      group.append(svg('path', {className: `flow-line ${classes}`, attrs: {d}}, [tooltip(name)]));
    }
    if (line.pin !== 0 && run.length > 1) continue;
    for (const k of run) {
      group.append(svg('circle', {className: `flow-point ${classes}`, attrs: {
        cx: round(geometry.xOf(k)), cy: round(yOf(values[k])), r: POINT_RADIUS,
        'data-layer': line.names[k], 'data-run': line.run, 'data-step': line.snapshot.step,
        'data-role': role, 'data-stat': stat, 'data-value': String(values[k]), ...attrsOf(k),
      }}));
    }
  }
}

/**
 * Each layer's update ratio (its weights as one vector) on a log axis, with
 * the healthy ~1e-3 as a guide; exact zeros on a row below it.
 */
function updatePanel(chart, geometry, place, lines) {
  const lists = lines.map(({ratios}) => ratios);
  const range = flowmodel.updateRatioRange(lists);
  const zeros = flowmodel.hasZero(lists);
  const group = svg('g', {className: 'flow-panel update-panel', attrs: {
    'data-role': UPDATE_ROLE, 'data-top': place.top, 'data-bottom': place.bottom, 'data-zero-y': place.zeroY,
    'data-log-low': range.low, 'data-log-high': range.high,
  }});
  chart.append(group);
  const box = {left: geometry.left, plotRight: geometry.plotRight};
  const logY = charts.logScale(range, {bottom: place.bottom, height: place.bottom - place.top, zeroY: place.zeroY});
  group.append(svg('text', {className: 'panel-title',
    text: 'Weight update ratio |Δw| / |w| since the previous log event (each layer\'s weights as one vector)',
    attrs: {x: geometry.left, y: place.titleY}}));
  charts.logAxis(group, box, {range, yOf: logY, zeroY: place.zeroY, zeros, maxTicks: 4});
  if (!lists.some((values) => values.some((value) => value !== null))) {
    group.append(svg('text', {className: 'empty-text', text: 'no update at or before this step: '
      + 'the first comes with the second log event',
    attrs: {x: (geometry.left + geometry.plotRight) / 2, y: (place.top + place.bottom) / 2, 'text-anchor': 'middle'}}));
  }
  for (const line of [...lines].sort((a, b) => b.pin - a.pin || b.series - a.series)) {
    draw(group, geometry, line, line.ratios, UPDATE_ROLE, 'update_ratio', flowmodel.drawableOnLogPanel, logY);
  }
  charts.updateRatioGuide(group, box, logY);
}

/** The vanishing and exploding thresholds of the view's run at the slider's step, where the axis reaches them. */
function thresholds(group, geometry, lines, range, logY) {
  const line = lines.find(({series, pin}) => series === 0 && pin === 0);
  const health = line?.snapshot.health;
  const reference = health?.reference_layer === null ? undefined : line?.layers.get(health?.reference_layer);
  const rms = reference?.flow?.output_gradient?.rms;
  if (!range || !flowmodel.onLogAxis(rms)) return;
  for (const [flag, value] of [['vanishing', rms / health.ratio], ['exploding', rms * health.ratio]]) {
    const position = flowmodel.logPosition(value, range);
    if (!(position >= 0 && position <= 1)) continue;
    const y = round(logY(value));
    const text = `RMS ${flag} ${flag === 'vanishing' ? 'below' : 'above'} ${model.formatNumber(value)}`;
    const title = `${text}: ${health.ratio}× the output gradient's RMS at ${health.reference_layer}`
      + ` (${model.formatNumber(rms)}), the reference layer`;
    group.append(svg('line', {className: `flow-threshold flag-${flag}`,
      attrs: {x1: geometry.left, x2: geometry.plotRight, y1: y, y2: y}}, [tooltip(title)]));
    charts.boxedLabel(group, {text, x: geometry.plotRight - 2, y: y - 3, anchor: 'end', size: 10,
      className: `threshold-label flag-${flag}`});
  }
}

// ------------------------------------------------------------ x axis, hover, legend

/** The layer names under the panels, read bottom to top, thinned where they would overlap. */
function layerLabels(chart, geometry, labels, slots, currentSlot) {
  const candidates = labels.map((text, k) => ({position: geometry.xOf(k), pinned: k === currentSlot, k, text}));
  for (const {position, k, text} of model.spacedLabels(candidates, LABEL_SPACING)) {
    const x = round(position + 3.5);
    const y = geometry.labelTop;
    const classes = `layer-label${k === currentSlot ? ' current' : ''}${slots[k].primary === null ? ' other-only' : ''}`;
    chart.append(svg('text', {className: classes, text,
      attrs: {x, y, 'text-anchor': 'end', transform: `rotate(-90 ${x} ${y})`, 'data-layer': flowmodel.slotName(slots[k])}}));
  }
}

/** The hover text of a layer's column: its full path and, per run, the values at the slider's step. */
function slotTitle(slot, label, k, lines, roles) {
  const name = flowmodel.slotName(slot);
  const rows = [label === name ? name : `${label} (${name})`];
  for (const line of lines) {
    const layer = line.layers.get(line.names[k]);
    if (!layer) {
      rows.push(line.names[k] === null ? `${line.run}: no such layer`
        : `${line.run}: not logged at or before step ${line.snapshot.step}`);
      continue;
    }
    rows.push(`${line.run}, step ${layer.step}${layer.layer_class ? ` (${layer.layer_class})` : ''}:`);
    for (const role of roles) {
      const flow = layer.flow?.[role];
      if (!flow) continue;
      const flush = flowmodel.flushShare(layer, role);
      rows.push(`  ${captions.ROLE_TITLES[role]}: RMS ${model.formatNumber(flow.rms)}, `
        + `max |value| ${model.formatNumber(flow.max_abs)}, ${model.formatPercent(flow.zero_fraction)} zeros`
        + (flush && flowmodel.FLUSH_ROLES.includes(role) ? `; ${flowmodel.flushText(flush)}` : ''));
    }
    if ((layer.update_ratio ?? null) !== null) {
      const size = captions.updateSize(layer.update_size);
      rows.push(`  Update ratio: ${model.formatNumber(layer.update_ratio)}${size ? ` (${size})` : ''}`);
    }
    for (const flag of layer.flags ?? []) rows.push(`  ⚑ ${captions.FLAG_TITLES[flag.flag] ?? flag.flag}: ${flag.detail}`);
  }
  if (slot.primary !== null) rows.push('Click to open this layer.');
  return rows.join('\n');
}

function legend(lines) {
  const sample = (stat) => svg('svg', {className: 'legend-sample', attrs: {viewBox: '0 0 24 8', 'aria-hidden': 'true'}},
    [svg('line', {className: `flow-line series-0 pin-0 stat-${stat}`, attrs: {x1: 1, x2: 23, y1: 4, y2: 4}})]);
  return html('ul', {className: 'flow-legend'}, [
    ...lines.map(({run, snapshot, series, pin}) => html('li', {className: `series-${series} pin-${pin}`}, [
      html('span', {className: 'swatch'}),
      html('span', {text: `${run}, step ${snapshot.step}${pin === 0 ? '' : ' (kept)'}`}),
    ])),
    html('li', {className: 'stat-key'}, [sample('rms'), html('span', {text: 'RMS'})]),
    html('li', {className: 'stat-key'}, [sample('max_abs'), html('span', {text: 'max |value|'})]),
    ...(lines.some(({flush}) => Object.values(flush).some((shares) => shares.some(Boolean)))
      ? [html('li', {className: 'stat-key'}, [sample('flush'), html('span', {text: 'share that flushes to zero'})])]
      : []),
  ]);
}

/** The steps kept as extra lines, each with a button that drops it. */
export function renderKeptSteps(list, steps, onRemove) {
  list.replaceChildren(...steps.map((step) => {
    const remove = html('button', {className: 'remove', text: '×',
      attrs: {type: 'button', 'aria-label': `Stop showing step ${step}`, title: `Stop showing step ${step}`}});
    remove.addEventListener('click', () => onRemove(step));
    return html('li', {attrs: {'data-step': step}}, [html('span', {text: `step ${step}`}), remove]);
  }));
}
