// host.js against a host played by the test over a real MessageChannel, with
// the messages TensorBoard's host page sends (see PLATFORM_NOTES.md).

import assert from 'node:assert/strict';
import {test} from 'node:test';

import {HostChannel, connectToHost, followHost} from '../../frontend/host.js';

/** A host end that answers requests with `answer(message)` and records every message. */
function fakeHost(port, answer = () => ({payload: null, error: null})) {
  const received = [];
  const waiters = [];
  port.addEventListener('message', (event) => {
    const message = JSON.parse(event.data);
    received.push(message);
    waiters.splice(0).forEach((wake) => wake());
    if (!message.isReply) {
      const {payload, error} = answer(message);
      port.postMessage(JSON.stringify({type: message.type, id: message.id, payload, error, isReply: true}));
    }
  });
  port.start();
  return {
    received,
    send(message) {
      port.postMessage(JSON.stringify(message));
    },
    async next(predicate) {
      while (!received.some(predicate)) await new Promise((wake) => waiters.push(wake));
      return received.find(predicate);
    },
  };
}

function withChannel(run) {
  return async () => {
    const {port1, port2} = new MessageChannel();
    try {
      await run(port1, port2);
    } finally {
      port1.close();
      port2.close();
    }
  };
}

test('a request resolves to the host\'s reply payload', withChannel(async (mine, theirs) => {
  const host = fakeHost(theirs, ({type}) => ({payload: type === 'experimental.GetRuns' ? ['a', 'b'] : null}));
  const channel = new HostChannel(mine);
  assert.deepEqual(await channel.request('experimental.GetRuns'), ['a', 'b']);
  assert.deepEqual(host.received, [
    {type: 'experimental.GetRuns', id: 0, payload: null, error: null, isReply: false}]);
}));

test('a request rejects on the host\'s error, or when it does not answer in time', withChannel(async (mine, theirs) => {
  fakeHost(theirs, () => ({payload: null, error: 'unknown type'}));
  const channel = new HostChannel(mine, {timeoutMs: 50});
  await assert.rejects(channel.request('experimental.Other'), /unknown type/);
  const silent = new MessageChannel();
  try {
    silent.port2.start();
    await assert.rejects(new HostChannel(silent.port1, {timeoutMs: 50}).request('experimental.GetRuns'),
      /no answer to experimental.GetRuns/);
  } finally {
    silent.port1.close();
    silent.port2.close();
  }
}));

test('the host\'s messages are answered with what the listener returns, once it is done', withChannel(async (mine, theirs) => {
  const host = fakeHost(theirs);
  const channel = new HostChannel(mine);
  channel.listen('experimental.Echo', async (payload) => `seen ${payload}`);
  channel.listen('experimental.Broken', () => {
    throw new Error('broken');
  });
  host.send('not json');
  host.send({type: 'experimental.Echo', id: 7, payload: 'x', error: null, isReply: false});
  host.send({type: 'experimental.Broken', id: 8, payload: null, error: null, isReply: false});
  host.send({type: 'experimental.Unheard', id: 9, payload: null, error: null, isReply: false});
  const reply = (id) => host.next((message) => message.isReply && message.id === id);
  assert.deepEqual(await reply(7), {type: 'experimental.Echo', id: 7, payload: 'seen x', error: null, isReply: true});
  assert.deepEqual(await reply(8), {type: 'experimental.Broken', id: 8, payload: null, error: 'Error: broken', isReply: true});
  assert.deepEqual(await reply(9), {type: 'experimental.Unheard', id: 9, payload: null, error: null, isReply: true});
}));

test('followHost asks for the runs and follows RunsChanged and DataReloaded', withChannel(async (mine, theirs) => {
  const host = fakeHost(theirs, ({type}) => ({payload: type === 'experimental.GetRuns' ? ['clean'] : null}));
  const events = [];
  const runs = await followHost(new HostChannel(mine), {
    onRuns: (names) => events.push(['runs', names]),
    onReload: () => events.push(['reload']),
  });
  assert.deepEqual(runs, ['clean']);
  host.send({type: 'experimental.RunsChanged', id: 0, payload: ['clean', 'nan'], error: null, isReply: false});
  host.send({type: 'experimental.RunsChanged', id: 1, payload: 'not a list', error: null, isReply: false});
  host.send({type: 'experimental.DataReloaded', id: 2, payload: null, error: null, isReply: false});
  await host.next((message) => message.isReply && message.id === 2);
  assert.deepEqual(events, [['runs', ['clean', 'nan']], ['runs', null], ['reload']]);
}));

for (const [what, answer] of [
  ['a payload that is not a list', () => ({payload: {runs: ['clean']}, error: null})],
  ['an error', () => ({payload: null, error: 'no such message'})],
]) {
  test(`followHost shows every run when the host answers GetRuns with ${what}`, withChannel(async (mine, theirs) => {
    fakeHost(theirs, answer);
    assert.equal(await followHost(new HostChannel(mine), {onRuns() {}, onReload() {}}), null);
  }));
}

test('connectToHost hands the parent a port with experimental.bootstrap', async () => {
  const alone = {location: {origin: 'http://localhost:6006'}};
  alone.parent = alone;
  assert.equal(connectToHost(alone), null);

  const posted = [];
  const framed = {
    location: {origin: 'http://localhost:6006'},
    parent: {postMessage: (...args) => posted.push(args)},
  };
  const channel = connectToHost(framed, {timeoutMs: 50});
  try {
    assert.equal(posted.length, 1);
    const [message, origin, [port]] = posted[0];
    assert.equal(message, 'experimental.bootstrap');
    assert.equal(origin, 'http://localhost:6006');
    const host = fakeHost(port, () => ({payload: ['clean'], error: null}));
    assert.deepEqual(await channel.request('experimental.GetRuns'), ['clean']);
    assert.equal(host.received.length, 1);
    port.close();
  } finally {
    channel.port.close();
  }
});
