// The real answers of /runs, /series, /routing and /step that
// tests/test_frontend_unit.py writes (a model trained with GradVizCallback and
// served by the plugin) into the folder named by GRADVIZ_FIXTURES.

import {readFileSync} from 'node:fs';
import {join} from 'node:path';

import * as model from '../../frontend/model.js';

const folder = process.env.GRADVIZ_FIXTURES;
if (!folder) {
  throw new Error('GRADVIZ_FIXTURES is not set: run these tests through '
    + '`python -m pytest tests/test_frontend_unit.py`, which writes the API answers they read');
}
const index = JSON.parse(readFileSync(join(folder, 'index.json'), 'utf8'));

function sameParams(a, b) {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((key) => a[key] === b[key]);
}

function find(route, params) {
  const found = index.find((entry) => entry.route === route && sameParams(entry.params, params));
  if (!found) throw new Error(`no recorded answer to ${route} ${JSON.stringify(params)}`);
  return found;
}

/** The body of a recorded answer, as the server wrote it. */
export function body(route, params = {}) {
  return readFileSync(join(folder, find(route, params).file), 'utf8');
}

/** A recorded answer, decoded as the tab decodes it. */
export function answer(route, params = {}) {
  return model.parseApiJson(body(route, params));
}

/** A `fetch` that answers the tab's relative URLs from the recorded answers. */
export async function recordedFetch(url) {
  const [route, query = ''] = url.split('?');
  const entry = find(route, Object.fromEntries(new URLSearchParams(query)));
  const text = readFileSync(join(folder, entry.file), 'utf8');
  return {ok: entry.status >= 200 && entry.status < 300, status: entry.status, text: async () => text};
}

export const runs = answer('runs').runs;

/** The /runs entry of a layer. */
export function layerOf(run, layer) {
  return runs.find((entry) => entry.run === run).layers.find((entry) => entry.layer === layer);
}

/** The /series answer of a tensor. */
export function series(run, layer, tensor) {
  return answer('series', {run, layer, tensor});
}
