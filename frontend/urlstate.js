// The tab's choice (run, layer, step, view) in TensorBoard's own URL, after
// the plugin's name: `#gradviz&run=R&layer=L&step=S&view=V`, so that a link
// opens the same view. TensorBoard keeps `&`-separated parameters after the
// tab name.

const KEYS = ['run', 'layer', 'step', 'view'];

/**
 * The tab's sections, as `view=` names them: the layer (its side-by-side view),
 * across layers (gradient flow, grid, flags), over time, and the run comparison.
 */
export const VIEWS = ['layer', 'layers', 'timeline', 'compare'];

/** The section a URL without a (known) `view=` opens. */
export const DEFAULT_VIEW = 'layer';

/**
 * The state a URL fragment asks for: `{run, layer, step, view}`, null where
 * it names no run, layer or step. `view` is always one of VIEWS: a missing or
 * unknown one is DEFAULT_VIEW.
 */
export function parseState(hash) {
  const [, ...rest] = String(hash ?? '').replace(/^#/, '').split('&');
  const params = new URLSearchParams(rest.join('&'));
  const step = params.get('step');
  const view = params.get('view');
  return {
    run: params.get('run'),
    layer: params.get('layer'),
    step: step !== null && /^-?\d+$/.test(step) ? Number(step) : null,
    view: VIEWS.includes(view) ? view : DEFAULT_VIEW,
  };
}

/** The fragment of a state, after `plugin` (its first part): `#gradviz&run=...`. */
export function formatState(plugin, state) {
  const params = new URLSearchParams();
  for (const key of KEYS) {
    if (state[key] !== null && state[key] !== undefined) params.set(key, String(state[key]));
  }
  const query = params.toString();
  return `#${plugin}${query ? `&${query}` : ''}`;
}

/** TensorBoard's page (the parent of the plugin's frame), or null where it cannot be reached. */
function hostWindow(window) {
  try {
    const host = window.parent;
    void host.location.hash; // throws on another origin
    return host;
  } catch {
    return null;
  }
}

/** The state in TensorBoard's URL. */
export function readHostState(window) {
  return parseState(hostWindow(window)?.location.hash ?? '');
}

/**
 * Puts the state into TensorBoard's URL. The entry is replaced, never pushed:
 * a slider move or a section switch adds no history step, so Back leaves the
 * tab as it leaves TensorBoard's other tabs.
 */
export function writeHostState(window, state) {
  const host = hostWindow(window);
  if (!host) return;
  const [plugin] = host.location.hash.replace(/^#/, '').split('&');
  if (!plugin) return;
  const hash = formatState(plugin, state);
  if (hash !== host.location.hash) host.history.replaceState(host.history.state, '', hash);
}
