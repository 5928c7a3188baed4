// Where each training-health flag began in a run (`/onset`): a compact table
// of each raised flag's first step, the layer and tensor where it began there
// (the server's choice: the first tensor that raised it in the order the step
// computed them), and whether it persists. Warnings (leading indicators, each a
// rule over a tensor's recent history) are rows of their own class after the
// flags'. Clicking a row's layer opens that
// layer at that step. The rows and texts are pure functions (run under node);
// OnsetTable puts them in the DOM.

import {FLAG_TITLES} from './captions.js';
import {html} from './dom.js';
import {markDrawn} from './drawn.js';
import {fetchJson} from './model.js';
import {LatestRequest} from './requests.js';

const COLUMNS = ['Flag', 'Class', 'First step', 'Layer', 'Tensor', 'Persists', 'What to try'];

/** The warnings' names as the table shows them (`leading.WARNINGS`). */
export const WARNING_TITLES = {
  rms_growth: 'RMS growth',
  max_growth: 'max |x| growth',
  rms_drift: 'RMS drift',
  peak_ratio: 'max / RMS ratio',
  update_spike: 'update spike',
  update_growth: 'update growth',
};

export function fetchOnset(run, fetchImpl) {
  return fetchJson('onset', {run}, fetchImpl);
}

/** One row per onset of a `/onset` body, in its order: the cells' texts and where a click goes. */
export function onsetRows(body) {
  return body.onsets.map((onset) => ({
    flag: onset.flag,
    kind: onset.class === 'warning' ? 'warning' : 'flag',
    title: FLAG_TITLES[onset.flag] ?? WARNING_TITLES[onset.flag] ?? onset.flag,
    step: onset.step,
    layer: onset.layer,
    tensor: onset.tensor,
    persists: onset.persists
      ? `yes, through step ${body.last_step}`
      : `no: raised at ${onset.raised_steps} of ${body.steps} steps, last at step ${onset.last_raised_step}`,
    detail: onset.detail,
    // A warning's likely cause and remedy (`format/remedies.py`); a flag's detail says what failed.
    remedy: onset.remedy ?? '',
  }));
}

/** The line above the table: which steps were judged, or that no flag was raised at any. */
export function onsetSummary(body) {
  const steps = body.steps === 1 ? '1 logged step' : `${body.steps} logged steps`;
  const span = body.steps === 1 ? `step ${body.first_step}` : `steps ${body.first_step} to ${body.last_step}`;
  if (body.onsets.length === 0) return `${body.run}: no flag was raised at any of its ${steps} (${span}).`;
  const warned = body.onsets.filter((onset) => onset.class === 'warning').length;
  const flagged = body.onsets.length - warned;
  const parts = [];
  if (flagged > 0) parts.push(flagged === 1 ? '1 flag' : `${flagged} flags`);
  if (warned > 0) parts.push(warned === 1 ? '1 warning' : `${warned} warnings`);
  return `${body.run}: ${parts.join(' and ')} raised in ${steps} (${span}). Where each began:`;
}

export class OnsetTable {
  /**
   * @param {function(Array, function(): Promise): Promise} cached the tab's fetch-once cache
   * @param {function(string, number): void} onSelect opens a layer at a step
   */
  constructor(cached, onSelect) {
    this.cached = cached;
    this.onSelect = onSelect;
    this.run = null;
    this.shown = null; // the run whose onsets the table shows
    this.requests = new LatestRequest();
    this.summary = html('p', {className: 'onset-summary', attrs: {role: 'status'}});
    this.table = html('table', {className: 'onset-table', attrs: {hidden: ''}});
    this.element = html('section', {className: 'onset-section'}, [
      html('h2', {text: 'Where each flag and warning began'}),
      this.summary,
      this.table,
    ]);
  }

  /** Fetches (once per run) and shows the onset of `run`. */
  async show(run) {
    this.run = run;
    if (run === null) return;
    const ticket = this.requests.start({run});
    // A line at once, so that the drawing below moves less when the answer comes.
    if (this.run !== this.shown) {
      this.summary.textContent = `${run}: judging every logged step...`;
      this.table.hidden = true;
    }
    let body;
    try {
      body = await this.cached(['onset', run], () => fetchOnset(run));
    } catch (error) {
      if (!this.requests.isCurrent(ticket, {run: this.run})) return;
      this.table.hidden = true;
      this.summary.textContent = error.status === 404
        ? `${run} has no logged step to judge.`
        : `Could not load where the flags began: ${error.message}`;
      markDrawn(this.element, {run, error: error.message});
      return;
    }
    if (!this.requests.isCurrent(ticket, {run: this.run})) return;
    this.summary.textContent = onsetSummary(body);
    const rows = onsetRows(body);
    this.table.hidden = rows.length === 0;
    this.table.replaceChildren(
      html('thead', {}, [html('tr', {}, COLUMNS.map((text) => html('th', {text, attrs: {scope: 'col'}})))]),
      html('tbody', {}, rows.map((row) => this.row(row))));
    this.shown = run;
    markDrawn(this.element, {run});
  }

  row({flag, kind, title, step, layer, tensor, persists, detail, remedy}) {
    const open = html('button', {className: 'onset-open', text: layer, attrs: {
      type: 'button', title: `Open ${layer} at step ${step}`, 'data-layer': layer, 'data-step': step}});
    open.addEventListener('click', () => this.onSelect(layer, step));
    return html('tr', {attrs: {'data-flag': flag, 'data-class': kind, title: detail}}, [
      html('th', {text: title, attrs: {scope: 'row'}}),
      html('td', {text: kind}),
      html('td', {className: 'onset-step', text: String(step)}),
      html('td', {}, [open]),
      html('td', {text: tensor}),
      html('td', {text: persists}),
      html('td', {className: 'onset-remedy', text: remedy}),
    ]);
  }
}
