// urlstate.js: the tab's choice in TensorBoard's URL fragment.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import * as urlstate from '../../frontend/urlstate.js';

test('a fragment names a run, a layer path, a step and a view; the rest is null or the default view', () => {
  assert.deepEqual(urlstate.parseState('#gradviz&run=resnet50&layer=resnet50%2Fpool1_pool&step=12&view=timeline'),
    {run: 'resnet50', layer: 'resnet50/pool1_pool', step: 12, view: 'timeline'});
  assert.deepEqual(urlstate.parseState('#gradviz'), {run: null, layer: null, step: null, view: 'layer'});
  assert.deepEqual(urlstate.parseState(''), {run: null, layer: null, step: null, view: 'layer'});
  assert.deepEqual(urlstate.parseState('#gradviz&step=twelve&run=a%26b'),
    {run: 'a&b', layer: null, step: null, view: 'layer'});
});

test('every section is a view; an unknown or empty view= opens the default one, without an error', () => {
  assert.deepEqual(urlstate.VIEWS, ['layer', 'layers', 'timeline', 'compare']);
  assert.equal(urlstate.DEFAULT_VIEW, 'layer');
  for (const view of urlstate.VIEWS) assert.equal(urlstate.parseState(`#gradviz&view=${view}`).view, view);
  for (const view of ['flow', 'Timeline', '', 'timeline ', '__proto__', 'toString']) {
    assert.equal(urlstate.parseState(`#gradviz&run=a&view=${encodeURIComponent(view)}`).view, 'layer', view);
  }
  assert.equal(urlstate.parseState('#gradviz&view=compare&view=layers').view, 'compare'); // the first one
});

test('a state written and read back is the same, after the plugin name, in the order run, layer, step, view', () => {
  const state = {run: 'cnn max', layer: 'block/pool#1', step: 40, view: 'compare'};
  const hash = urlstate.formatState('gradviz', state);
  assert.equal(hash, '#gradviz&run=cnn+max&layer=block%2Fpool%231&step=40&view=compare');
  assert.deepEqual(urlstate.parseState(hash), state);
  assert.equal(urlstate.formatState('gradviz', {run: null, layer: undefined, step: null}), '#gradviz');
  assert.equal(urlstate.formatState('gradviz', {run: null, view: 'timeline'}), '#gradviz&view=timeline');
});

test('the host page\'s URL is read and replaced (never pushed), never on another origin', () => {
  const replaced = [];
  const host = {
    location: {hash: '#gradviz&run=a'},
    history: {state: 1, replaceState: (s, t, url) => replaced.push(url),
      pushState: () => assert.fail('a switch must not add a history entry')},
  };
  const frame = {parent: host};
  assert.deepEqual(urlstate.readHostState(frame), {run: 'a', layer: null, step: null, view: 'layer'});
  urlstate.writeHostState(frame, {run: 'a', layer: 'pool', step: 3, view: 'layer'});
  urlstate.writeHostState(frame, {run: 'a', layer: 'pool', step: 3, view: 'timeline'});
  assert.deepEqual(replaced, ['#gradviz&run=a&layer=pool&step=3&view=layer', '#gradviz&run=a&layer=pool&step=3&view=timeline']);
  const foreign = {get parent() { return {get location() { throw new Error('cross-origin'); }}; }};
  assert.deepEqual(urlstate.readHostState(foreign), {run: null, layer: null, step: null, view: 'layer'});
  urlstate.writeHostState(foreign, {run: 'a'}); // no throw
});
