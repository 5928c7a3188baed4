// drawn.js: the marker a view sets on its element once it has drawn a state.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {drawnState, markDrawn} from '../../frontend/drawn.js';

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

test('markDrawn sets data-drawn to the marker of the state', () => {
  const attributes = {};
  markDrawn({setAttribute: (name, value) => { attributes[name] = value; }}, {step: 2, run: 'a'});
  assert.deepEqual(attributes, {'data-drawn': '{"run":"a","step":2}'});
});
