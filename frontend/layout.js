// The GradViz tab's page: its stylesheets, TensorBoard's theme, the controls
// shared by every section (run, layer, step), the tab bar of the sections
// (sections.js) and the containers every view draws into. DOM only; the views
// fill the containers (views.js, weightsview.js, flow.js, compare.js, routemap.js).

import {hintedSection, html, labelled} from './dom.js';
import {Sections} from './sections.js';

// One stylesheet per part of the page, in cascade order.
const STYLESHEETS = ['style.css', 'sections.css', 'charts.css', 'compare.css', 'flow.css', 'precision.css', 'routemap.css',
  'timeline.css', 'flags.css'];

export function addStylesheets() {
  // Resolved against this module, not the document, whose base is plugin/gradviz/.
  document.head.append(...STYLESHEETS.map((name) => {
    const link = document.createElement('link');
    link.rel = 'stylesheet';
    link.href = new URL(`./${name}`, import.meta.url).href;
    return link;
  }));
}

/**
 * Mirrors TensorBoard's dark mode (a class on the host page's body) onto this
 * document. Outside TensorBoard the stylesheet follows prefers-color-scheme.
 */
export function followHostTheme() {
  let hostBody = null;
  try {
    hostBody = window.parent !== window ? window.parent.document.body : null;
  } catch {
    return; // A cross-origin parent is not TensorBoard.
  }
  if (!hostBody) return;
  const apply = () => {
    const dark = hostBody.classList.contains('dark-mode');
    document.documentElement.classList.toggle('dark-mode', dark);
    document.documentElement.classList.toggle('light-mode', !dark);
  };
  apply();
  new MutationObserver(apply).observe(hostBody, {attributes: true, attributeFilter: ['class']});
}

// ------------------------------------------------------------ page layout

/**
 * Builds the page and returns its controls and containers. Controls are
 * native elements inside their <label>, so they work from the keyboard and
 * are named for screen readers (and for the browser tests).
 */
export function createLayout(root) {
  const runSelect = html('select', {attrs: {name: 'run'}});
  const layerSelect = html('select', {attrs: {name: 'layer'}});
  const stepSlider = html('input', {attrs: {type: 'range', name: 'step', min: 0, max: 0, step: 1, value: 0}});
  const stepOutput = html('output', {className: 'step-value', attrs: {'aria-live': 'polite'}});
  const logToggle = html('input', {attrs: {type: 'checkbox', name: 'log-counts'}});
  const reloadButton = html('button', {text: 'Reload', attrs: {type: 'button'}});
  const compareTensorSelect = html('select', {attrs: {name: 'compare-tensor'}});
  const compareRunSelect = html('select', {attrs: {name: 'compare-run'}});
  const flowRunSelect = html('select', {attrs: {name: 'flow-run'}});
  const keepStepButton = html('button', {text: 'Keep this step', attrs: {type: 'button'}});

  const controls = html('header', {className: 'toolbar'}, [
    labelled('Run', runSelect),
    labelled('Layer', layerSelect, 'layer-control'),
    html('div', {className: 'step-control'}, [labelled('Step', stepSlider), stepOutput]),
    labelled('Log count axis', logToggle, 'toggle'),
    reloadButton,
  ]);

  const status = html('p', {className: 'status', attrs: {role: 'status'}});
  const keptSteps = html('ul', {className: 'kept-steps'});
  const flowSummary = html('p', {className: 'flow-summary'});
  const flow = html('div', {className: 'flow-container'});
  const layerTitle = html('h2', {className: 'layer-title'});
  const fullRecords = html('p', {className: 'hint full-records'});
  const panels = html('div', {className: 'panels'});
  const precision = html('section', {className: 'precision-section'});
  const weights = html('section', {className: 'weights-section', attrs: {hidden: ''}});
  const routeMap = html('section', {className: 'routemap-container'});
  const aside = html('aside', {className: 'explanation'});
  const heatmaps = html('div', {className: 'heatmaps'});
  const gridTitle = html('h2', {text: 'All layers'});
  const grid = html('div', {className: 'grid-container'});
  const compareCharts = html('div', {className: 'compare-charts'});

  const layerSection = html('section', {className: 'layer-section'}, [
    layerTitle,
    fullRecords,
    html('div', {className: 'layer-view'}, [
      html('div', {className: 'layer-main'}, [
        panels,
        precision,
        weights,
        routeMap,
        html('h2', {text: 'Distribution over steps'}),
        html('p', {className: 'hint', text:
          'Each column is one logged step, or on a long run a group of consecutive steps with the '
          + 'largest share among them; rows are magnitude bins, positive values above the middle row '
          + 'of exact zeros, negative below. Darker means a larger share of the elements: the colour bar '
          + 'under each says how large. Under it, '
          + 'the spread (std) over steps, each column from its smallest to its largest value: hover '
          + 'to read its steps, click to open the last.'}),
        heatmaps,
      ]),
      aside,
    ]),
  ]);

  const sections = new Sections();
  sections.panel('layer').append(layerSection);
  sections.panel('layers').append(
    hintedSection('flow-section', 'Gradient flow across layers',
      'Every logged layer in model order, input on the left. Per tensor, on a log axis: the RMS (solid) and '
      + 'the largest magnitude (dashed) of its values; below, the share of exact zeros. One line per step: '
      + 'the slider\'s, and the ones kept. Badges mark the training-health flags (hover for the rule). '
      + 'Click a layer to open it in "The layer".', [
      html('div', {className: 'toolbar'}, [
        labelled('Overlay run', flowRunSelect),
        keepStepButton,
        keptSteps,
      ]),
      flowSummary,
      flow,
    ]),
    html('section', {}, [gridTitle, grid]),
  );
  sections.panel('compare').append(
    html('section', {}, [
      html('h2', {text: 'Compare runs'}),
      html('div', {className: 'toolbar'}, [
        labelled('Tensor', compareTensorSelect),
        labelled('Against run', compareRunSelect),
      ]),
      compareCharts,
    ]),
  );
  // The "Over time" panel is filled by the tab (the onset table and the depth x time view).
  const page = html('main', {className: 'gradviz'}, [
    controls,
    status,
    sections.tabList,
    ...sections.panels.values(),
  ]);
  root.replaceChildren(page);
  return {
    runSelect, layerSelect, stepSlider, stepOutput, logToggle, reloadButton,
    compareTensorSelect, compareRunSelect, flowRunSelect, keepStepButton,
    status, keptSteps, flowSummary, flow, layerSection, layerTitle, fullRecords, panels, precision, weights, routeMap, aside, heatmaps, gridTitle, grid,
    compareCharts, sections,
  };
}

/**
 * Replaces a select's options, keeping `selected` when it is still offered.
 * Consecutive options with the same `group` go into one <optgroup>.
 */
export function setOptions(select, options, selected) {
  const nodes = [];
  let group = null;
  for (const {value, label, group: name} of options) {
    const option = html('option', {text: label ?? value});
    option.value = value;
    if (!name) {
      group = null;
      nodes.push(option);
      continue;
    }
    if (group?.label !== name) nodes.push((group = html('optgroup', {attrs: {label: name}})));
    group.append(option);
  }
  select.replaceChildren(...nodes);
  if (options.some((option) => option.value === selected)) select.value = selected;
  select.disabled = options.length === 0;
}

export function showStatus(status, message, isError = false) {
  status.textContent = message;
  status.classList.toggle('error', isError);
  status.hidden = !message;
}
