// urlstate.js: the tab's choice in TensorBoard's URL fragment.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as urlstate from '../../frontend/urlstate.js';

test('a fragment names a run, a layer path and a step; the rest is null', () => {
  assert.deepEqual(urlstate.parseState('#gradviz&run=resnet50&layer=resnet50%2Fpool1_pool&step=12'),
    {run: 'resnet50', layer: 'resnet50/pool1_pool', step: 12});
  assert.deepEqual(urlstate.parseState('#gradviz'), {run: null, layer: null, step: null});
  assert.deepEqual(urlstate.parseState(''), {run: null, layer: null, step: null});
  assert.deepEqual(urlstate.parseState('#gradviz&step=twelve&run=a%26b'), {run: 'a&b', layer: null, step: null});
});

test('a state written and read back is the same, after the plugin name', () => {
  const state = {run: 'cnn max', layer: 'block/pool#1', step: 40};
  const hash = urlstate.formatState('gradviz', state);
  assert.ok(hash.startsWith('#gradviz&run='), hash);
  assert.deepEqual(urlstate.parseState(hash), state);
  assert.equal(urlstate.formatState('gradviz', {run: null, layer: undefined, step: null}), '#gradviz');
});

test('the host page\'s URL is read and replaced, never on another origin', () => {
  const replaced = [];
  const host = {location: {hash: '#gradviz&run=a'}, history: {state: 1, replaceState: (s, t, url) => replaced.push(url)}};
  const frame = {parent: host};
  assert.deepEqual(urlstate.readHostState(frame), {run: 'a', layer: null, step: null});
  urlstate.writeHostState(frame, {run: 'a', layer: 'pool', step: 3});
  assert.deepEqual(replaced, ['#gradviz&run=a&layer=pool&step=3']);
  const foreign = {get parent() { return {get location() { throw new Error('cross-origin'); }}; }};
  assert.deepEqual(urlstate.readHostState(foreign), {run: null, layer: null, step: null});
  urlstate.writeHostState(foreign, {run: 'a'}); // no throw
});
