// requests.js: the tab's answer cache (bounded, least recently used out) and
// the guard that lets only the latest request's answer draw.

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {AnswerCache, CACHE_ENTRIES, LatestRequest} from '../../frontend/requests.js';

/** A fetch that counts its calls and answers `value`. */
function counting(value) {
  const fetch = () => {
    fetch.calls += 1;
    return Promise.resolve(value);
  };
  fetch.calls = 0;
  return fetch;
}

test('the page cache of answers holds at most its limit, dropping the least recently used', async () => {
  const cache = new AnswerCache(3);
  const fetches = [0, 1, 2, 3].map((i) => counting(`body ${i}`));
  for (const i of [0, 1, 2]) assert.equal(await cache.get(['step', 'run', i], fetches[i]), `body ${i}`);
  // Step 0 used again: step 1 is now the least recently used, and the fourth key drops it.
  assert.equal(await cache.get(['step', 'run', 0], fetches[0]), 'body 0');
  await cache.get(['step', 'run', 3], fetches[3]);
  assert.equal(cache.size, 3);
  assert.deepEqual([0, 1, 2, 3].map((i) => cache.has(['step', 'run', i])), [true, false, true, true]);
  assert.deepEqual(fetches.map((fetch) => fetch.calls), [1, 1, 1, 1]);
  // A dropped key is fetched again; a kept one is not.
  await cache.get(['step', 'run', 1], fetches[1]);
  await cache.get(['step', 'run', 3], fetches[3]);
  assert.deepEqual(fetches.map((fetch) => fetch.calls), [1, 2, 1, 1]);
  assert.equal(cache.size, 3);
});

test('the page cache of /step bodies stays bounded over ten thousand steps', async () => {
  const cache = new AnswerCache();
  for (let step = 0; step < 10000; step++) await cache.get(['step', 'run', step], counting({step}));
  assert.equal(cache.size, CACHE_ENTRIES);
  assert.ok(cache.has(['step', 'run', 9999]) && !cache.has(['step', 'run', 9999 - CACHE_ENTRIES]));
});

test('a failed fetch is forgotten and retried; a key asked twice while in flight is fetched once', async () => {
  const cache = new AnswerCache(4);
  let calls = 0;
  const failing = () => {
    calls += 1;
    return Promise.reject(new Error('HTTP 500'));
  };
  await assert.rejects(cache.get(['timeline', 'a'], failing), /HTTP 500/);
  assert.equal(cache.has(['timeline', 'a']), false);
  await assert.rejects(cache.get(['timeline', 'a'], failing), /HTTP 500/);
  assert.equal(calls, 2);
  let resolve;
  let pendingCalls = 0;
  const pending = () => {
    pendingCalls += 1;
    return new Promise((done) => (resolve = done));
  };
  const first = cache.get(['timeline', 'b'], pending);
  const second = cache.get(['timeline', 'b'], pending);
  resolve('body');
  assert.deepEqual([await first, await second, pendingCalls], ['body', 'body', 1]);
});

test('a failure of a fetch made before clear() does not forget the fetch made after it', async () => {
  const cache = new AnswerCache(4);
  let fail;
  const old = cache.get(['onset', 'a'], () => new Promise((_, reject) => (fail = reject)));
  cache.clear();
  const fresh = cache.get(['onset', 'a'], () => Promise.resolve('new body'));
  fail(new Error('gone'));
  await assert.rejects(old, /gone/);
  assert.equal(cache.has(['onset', 'a']), true);
  assert.equal(await fresh, 'new body');
  assert.throws(() => new AnswerCache(0), /positive integer; received: 0/);
});

test('an older request answering after a newer one is not current, whatever its state', () => {
  const requests = new LatestRequest();
  const older = requests.start({run: 'a', colour: 'rms/output_gradient', against: null, width: 1000});
  const newer = requests.start({run: 'a', colour: 'zero_share/activation', against: null, width: 1000});
  const now = {run: 'a', colour: 'zero_share/activation', against: null, width: 1000};
  assert.equal(requests.isCurrent(newer, now), true);
  assert.equal(requests.isCurrent(older, now), false);
  // The same state asked again (after a reload): only the new request's answer is current.
  const again = requests.start(now);
  assert.equal(requests.isCurrent(newer, now), false);
  assert.equal(requests.isCurrent(again, now), true);
});

test('the latest request is not current once any part of the state moved on without a new request', () => {
  const requests = new LatestRequest();
  const state = {run: 'a', colour: 'rms/output_gradient', against: 'b', width: 1000};
  const ticket = requests.start(state);
  assert.equal(requests.isCurrent(ticket, {...state}), true);
  for (const moved of [{run: 'c'}, {colour: 'rms/activation'}, {against: null}, {width: 950}]) {
    assert.equal(requests.isCurrent(ticket, {...state, ...moved}), false, JSON.stringify(moved));
  }
});
