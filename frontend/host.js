// TensorBoard's plugin message protocol, as the host page speaks it: JSON
// strings `{type, id, payload, error, isReply}` over a MessagePort that this
// frame hands to the host with 'experimental.bootstrap'. No DOM beyond the
// window and port it is given, so it runs under node with a MessageChannel.

// The host may never answer (an older TensorBoard, or the page opened in some
// other frame): then the tab shows every run, as it does outside TensorBoard.
export const HOST_TIMEOUT_MS = 3000;

export class HostChannel {
  /**
   * @param {MessagePort} port this frame's end of the channel.
   * @param {{timeoutMs?: number}} options how long a request waits for its reply.
   */
  constructor(port, {timeoutMs = HOST_TIMEOUT_MS} = {}) {
    this.port = port;
    this.timeoutMs = timeoutMs;
    this.nextId = 0;
    this.pending = new Map();
    this.listeners = new Map();
    port.addEventListener('message', (event) => this.receive(event.data));
    port.start();
  }

  /** Answers the host's messages of `type` with what `callback(payload)` returns. */
  listen(type, callback) {
    this.listeners.set(type, callback);
  }

  /** Sends a request; resolves to the host's reply payload, rejects on its error or silence. */
  request(type, payload = null) {
    const id = this.nextId++;
    this.post({type, id, payload, error: null, isReply: false});
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`no answer to ${type}`));
      }, this.timeoutMs);
      this.pending.set(id, {resolve, reject, timer});
    });
  }

  async receive(data) {
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const {type, id, payload, error, isReply} = message;
    if (isReply) {
      const waiting = this.pending.get(id);
      if (!waiting) return;
      this.pending.delete(id);
      clearTimeout(waiting.timer);
      if (error) waiting.reject(new Error(String(error)));
      else waiting.resolve(payload);
      return;
    }
    // The host waits for a reply to each of its messages, as we do for ours.
    let result = null;
    let failure = null;
    try {
      result = (await this.listeners.get(type)?.(payload)) ?? null;
    } catch (e) {
      failure = String(e);
    }
    this.post({type, id, payload: result, error: failure, isReply: true});
  }

  post(message) {
    this.port.postMessage(JSON.stringify(message));
  }
}

/**
 * Hands the host page of `win` one end of a new channel; null when the page
 * has no host (opened on its own, not in TensorBoard's iframe).
 */
export function connectToHost(win, options) {
  if (win.parent === win) return null;
  const channel = new MessageChannel();
  win.parent.postMessage('experimental.bootstrap', win.location.origin, [channel.port2]);
  return new HostChannel(channel.port1, options);
}

/** The run names of a host payload; null (every run) for anything but a list. */
function runNames(payload) {
  return Array.isArray(payload) ? payload : null;
}

/**
 * Follows the host's run list and reload button: `onRuns(names)` when the
 * runs selected in TensorBoard change, `onReload()` when its data is reloaded.
 *
 * @returns {Promise<?string[]>} the runs selected now; null when the host does not say.
 */
export async function followHost(channel, {onRuns, onReload}) {
  channel.listen('experimental.RunsChanged', (payload) => onRuns(runNames(payload)));
  channel.listen('experimental.DataReloaded', () => onReload());
  try {
    return runNames(await channel.request('experimental.GetRuns'));
  } catch {
    return null;
  }
}
