// The DOM of the routing-map view (routemap.js): its controls, its three
// figures (a canvas for the map, one for the hover's marks, a caption and a
// legend each), the tooltip, and the legends of its colours and marks.

import {formatNumber} from './model.js';
import {html, svg} from './dom.js';

function figure(className) {
  const base = html('canvas', {className: 'base', attrs: {role: 'img'}});
  const overlay = html('canvas', {className: 'overlay', attrs: {'aria-hidden': 'true'}});
  const stack = html('div', {className: 'routemap-stack'}, [base, overlay]);
  const caption = html('figcaption');
  const legend = html('div', {className: 'routemap-legend'});
  const element = html('figure', {className: `routemap-figure ${className}`}, [caption, stack, legend]);
  return {element, base, overlay, stack, caption, legend};
}

/** Builds the view's controls, figures and tooltip in `container`; returns them. */
export function buildView(container) {
  const channelSelect = html('select', {attrs: {name: 'map-channel', id: 'gradviz-map-channel'}});
  const stepSlider = html('input',
    {attrs: {type: 'range', name: 'map-step', id: 'gradviz-map-step', min: 0, max: 0, step: 1}});
  const stepOutput = html('output', {className: 'map-step-value', attrs: {'aria-live': 'polite'}});
  const ui = {
    channelSelect, stepSlider, stepOutput,
    meta: html('span', {className: 'layer-meta'}),
    status: html('p', {className: 'status error', attrs: {hidden: ''}}),
    rule: html('span', {className: 'routemap-rule'}),
    check: html('span', {className: 'routemap-check'}),
    summary: html('p', {className: 'routemap-summary'}),
    input: figure('input'),
    gradient: figure('gradient'),
    upstream: figure('upstream'),
    tooltip: html('div', {className: 'routemap-tooltip', attrs: {role: 'tooltip', hidden: ''}}),
  };
  ui.input.stack.tabIndex = 0;
  ui.input.stack.setAttribute('aria-label', 'input map: arrow keys walk the windows');
  ui.figures = html('div', {className: 'routemap-figures'}, [ui.input.element, ui.gradient.element, ui.upstream.element]);
  const control = (text, element) => html('span', {className: 'control'}, [
    html('label', {className: 'label-text', text, attrs: {for: element.id}}), element]);
  container.classList.add('routemap');
  container.replaceChildren(
    html('h2', {className: 'routemap-title'}, [html('span', {text: 'Routing map '}), ui.meta]),
    html('p', {className: 'hint', text: 'Where each window\'s maximum was and where its gradient went, for one '
      + 'probe example. Outlined squares are the pooling windows; a dot marks the position that won a window '
      + '(a larger dot, several windows). Tied windows are tinted and dashed: their maximum occurs more than once. '
      + 'Striped cells are exactly 0. Hover a window (or focus the input map and use the arrow keys) for its '
      + 'values; a tied window rings its other maxima.'}),
    html('div', {className: 'toolbar'}, [control('Channel', channelSelect),
      html('span', {className: 'step-control'}, [control('Map step', stepSlider), stepOutput])]),
    html('p', {className: 'routemap-rules'}, [ui.rule, html('span', {text: ' '}), ui.check]),
    ui.summary, ui.status, ui.figures, ui.tooltip,
  );
  return ui;
}

/** A colour ramp from 0 to the largest magnitude, and the stripes of exact zeros. */
export function scaleLegend(max, scale) {
  const low = scale === 'log' ? `${formatNumber(max / 1000)}` : '0';
  return [
    html('span', {className: 'legend-item'}, [html('span', {className: 'swatch zeros'}), html('span', {text: 'exactly 0'})]),
    html('span', {className: 'legend-item'}, [
      html('span', {text: scale === 'log' ? `|x| ${low}` : low}),
      html('span', {className: 'ramp'}),
      html('span', {text: `${formatNumber(max)}${scale === 'log' ? ' (log)' : ''}`}),
    ]),
    html('span', {className: 'legend-item'}, [html('span', {className: 'swatch negative'}), html('span', {text: '< 0'}),
      html('span', {className: 'swatch positive'}), html('span', {text: '> 0'})]),
  ];
}

function glyph(children) {
  return svg('svg', {className: 'glyph', attrs: {viewBox: '0 0 14 14', 'aria-hidden': 'true'}}, children);
}

/** The marks drawn over the input map: a winner, a tied window, a tie's other maxima. */
export function markerLegend() {
  return [
    html('span', {className: 'legend-item'}, [glyph([svg('circle', {className: 'winner', attrs: {cx: 7, cy: 7, r: 3.5}})]),
      html('span', {text: 'winner'})]),
    html('span', {className: 'legend-item'}, [glyph([svg('rect', {className: 'tied-window',
      attrs: {x: 1.5, y: 1.5, width: 11, height: 11}})]), html('span', {text: 'tied window'})]),
    html('span', {className: 'legend-item'}, [glyph([svg('circle', {className: 'tied', attrs: {cx: 7, cy: 7, r: 3.5}})]),
      html('span', {text: 'also the maximum (on hover)'})]),
  ];
}
