// drawn.js: the marker a view sets on its element once it has drawn a state.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {drawnState, markDrawn, markWhenDrawn} from '../../frontend/drawn.js';

test('one state has one marker, whatever the order its entries were given in', () => {
  const marker = drawnState({step: 5, run: 'mixed', layer: 'conv2'});
  assert.equal(marker, '{"layer":"conv2","run":"mixed","step":5}');
  assert.equal(drawnState({layer: 'conv2', step: 5, run: 'mixed'}), marker);
  assert.equal(drawnState({run: 'a', step: 5, against: null, kept: [3, 1]}),
    '{"against":null,"kept":[3,1],"run":"a","step":5}');
});

test('states that differ in one entry have different markers', () => {
  const base = {run: 'a', layer: 'pool', step: 5};
  assert.notEqual(drawnState(base), drawnState({...base, step: 4}));
  assert.notEqual(drawnState(base), drawnState({...base, layer: 'conv'}));
  assert.notEqual(drawnState(base), drawnState({...base, logarithmic: false}));
});

test('names from the log directory are written as JSON strings, quotes and markup included', () => {
  const run = '"><svg onload=alert(2)>';
  const marker = drawnState({run, layer: '<img src=x onerror=alert(1)>', step: 3});
  assert.deepEqual(JSON.parse(marker), {layer: '<img src=x onerror=alert(1)>', run, step: 3});
  assert.equal(drawnState({run: 'é/ü'}), '{"run":"é/ü"}');
});

function element() {
  const attributes = {};
  return {attributes, setAttribute: (name, value) => { attributes[name] = value; }};
}

function later() {
  let resolve;
  const promise = new Promise((done) => { resolve = done; });
  return {promise, resolve};
}

test('markDrawn sets data-drawn to the marker of the state', () => {
  const view = element();
  markDrawn(view, {step: 2, run: 'a'});
  assert.deepEqual(view.attributes, {'data-drawn': '{"run":"a","step":2}'});
});

test('markWhenDrawn marks once the drawing has finished, not before', async () => {
  const view = element();
  markDrawn(view, {step: 1});
  const drawing = later();
  const marked = markWhenDrawn([view], {step: 2}, drawing.promise);
  await Promise.resolve();
  assert.equal(view.attributes['data-drawn'], '{"step":1}');
  drawing.resolve();
  await marked;
  assert.equal(view.attributes['data-drawn'], '{"step":2}');
});

test('a drawing that finishes after a later one was marked leaves the later marker', async () => {
  const panels = element();
  const title = element();
  const slow = later();
  const first = markWhenDrawn([panels, title], {step: 1}, slow.promise);
  const second = markWhenDrawn([panels, title], {step: 2}, Promise.resolve());
  await second;
  slow.resolve();
  await first;
  assert.equal(panels.attributes['data-drawn'], '{"step":2}');
  assert.equal(title.attributes['data-drawn'], '{"step":2}');
  // A marker set at once after a pending one wins as well.
  const pending = later();
  const third = markWhenDrawn([panels], {step: 3}, pending.promise);
  markDrawn(panels, {step: 4});
  pending.resolve();
  await third;
  assert.equal(panels.attributes['data-drawn'], '{"step":4}');
});
