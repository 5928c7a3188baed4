// The tab's sections and the tab bar that switches between them, as WAI-ARIA
// tabs: a tablist of tabs, each controlling one tabpanel; one panel is shown
// at a time. Left / Right move to the previous / next tab (wrapping), Home and
// End to the first and last, and the tab moved to is chosen. DOM only: what a
// section fetches and draws is the tab's business (`onChoose`).

import {html} from './dom.js';
import {DEFAULT_VIEW, VIEWS} from './urlstate.js';

const LABELS = {layer: 'The layer', layers: 'Across layers', timeline: 'Over time', compare: 'Compare runs'};

export class Sections {
  /**
   * @param {function(string): void} onChoose called with the view a user chose (click or key)
   */
  constructor(onChoose = () => {}) {
    this.onChoose = onChoose;
    this.view = DEFAULT_VIEW;
    this.tabs = new Map();
    this.panels = new Map();
    for (const view of VIEWS) {
      const tab = html('button', {className: 'section-tab', text: LABELS[view], attrs: {
        type: 'button', role: 'tab', id: `gradviz-tab-${view}`, 'aria-controls': `gradviz-panel-${view}`,
        'data-view': view}});
      tab.addEventListener('click', () => this.choose(view));
      this.tabs.set(view, tab);
      this.panels.set(view, html('div', {className: `section-panel ${view}-panel`, attrs: {
        role: 'tabpanel', id: `gradviz-panel-${view}`, 'aria-labelledby': tab.id, 'data-view': view}}));
    }
    this.tabList = html('div', {className: 'section-tabs', attrs: {role: 'tablist', 'aria-label': 'GradViz views'}},
      [...this.tabs.values()]);
    this.tabList.addEventListener('keydown', (event) => this.onKey(event));
    this.show(this.view);
  }

  /** The panel of `view`, to fill with its section's content. */
  panel(view) {
    return this.panels.get(view);
  }

  /** Shows `view`'s panel and marks its tab selected; other panels are hidden. */
  show(view) {
    this.view = VIEWS.includes(view) ? view : DEFAULT_VIEW;
    for (const [name, tab] of this.tabs) {
      const selected = name === this.view;
      tab.setAttribute('aria-selected', String(selected));
      tab.tabIndex = selected ? 0 : -1;
      this.panels.get(name).hidden = !selected;
    }
  }

  choose(view, focus = false) {
    if (focus) this.tabs.get(view).focus();
    if (view !== this.view) this.onChoose(view);
  }

  onKey(event) {
    const index = VIEWS.indexOf(this.view);
    const target = {
      ArrowLeft: VIEWS[(index + VIEWS.length - 1) % VIEWS.length],
      ArrowRight: VIEWS[(index + 1) % VIEWS.length],
      Home: VIEWS[0],
      End: VIEWS.at(-1),
    }[event.key];
    if (!target) return;
    event.preventDefault();
    this.choose(target, true);
  }
}
