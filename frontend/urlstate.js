// The tab's choice (run, layer, step) in TensorBoard's own URL, after the
// plugin's name: `#gradviz&run=R&layer=L&step=S`, so that a link opens the
// same view. TensorBoard keeps `&`-separated parameters after the tab name.

const KEYS = ['run', 'layer', 'step'];

/** The state a URL fragment asks for: `{run, layer, step}`, null where it names none. */
export function parseState(hash) {
  const [, ...rest] = String(hash ?? '').replace(/^#/, '').split('&');
  const params = new URLSearchParams(rest.join('&'));
  const step = params.get('step');
  return {
    run: params.get('run'),
    layer: params.get('layer'),
    step: step !== null && /^-?\d+$/.test(step) ? Number(step) : null,
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

/** Puts the state into TensorBoard's URL (replacing the entry: no history step per slider move). */
export function writeHostState(window, state) {
  const host = hostWindow(window);
  if (!host) return;
  const [plugin] = host.location.hash.replace(/^#/, '').split('&');
  if (!plugin) return;
  const hash = formatState(plugin, state);
  if (hash !== host.location.hash) host.history.replaceState(host.history.state, '', hash);
}
