// Following WatchSessions through /api/events. The browser's EventSource
// reconnects by itself after a dropped connection, sending the last event
// id it received (Last-Event-ID), so the server resumes after it; and any
// event whose cursor this page has applied already is dropped here, so none
// is shown twice. A cursor is `shard:position` pairs (the event log is
// ordered per shard); an event is new when its cursor is past the last one
// applied in some shard.

import { enc } from './api.js';

const listeners = new Set();

/** Called with 'live', 'reconnecting' or 'closed' as streams change. */
export function onLiveState(callback) {
  listeners.add(callback);
}

function tell(state) {
  for (const callback of listeners) callback(state);
}

/**
 * Follows the events `filter` names ({workspace, tree, session, output}),
 * after cursor `after`; calls `apply(event)` once per event, in order.
 * `onEnd(reason)` hears of a refusal or a sign-out.
 */
export function follow(filter, after, apply, onEnd) {
  let last = after || '';
  const params = new URLSearchParams();
  for (const key of ['workspace', 'tree', 'session']) {
    if (filter[key]) params.set(key, filter[key]);
  }
  if (filter.output === false) params.set('output', 'false');
  params.set('after', String(last));
  const source = new EventSource(`/api/events?${params}`);
  source.addEventListener('open', () => tell('live'));
  source.addEventListener('error', () => tell(source.readyState === EventSource.CLOSED ? 'closed' : 'reconnecting'));
  source.addEventListener('session', (message) => {
    const cursor = message.lastEventId;
    if (!advances(cursor, last)) return; // applied already
    last = cursor;
    apply(JSON.parse(message.data));
  });
  for (const kind of ['refused', 'signed_out']) {
    source.addEventListener(kind, (message) => {
      source.close();
      tell('closed');
      if (onEnd) onEnd(kind, JSON.parse(message.data || '{}'));
    });
  }
  return {
    close() {
      source.close();
    },
    get cursor() {
      return last;
    },
  };
}

/** A cursor's positions by shard: `3:7,22:1234` as {3: 7, 22: 1234}. */
function positions(cursor) {
  const at = {};
  for (const pair of String(cursor || '').split(',')) {
    const [shard, position] = pair.split(':');
    if (position !== undefined) at[shard] = Number(position);
  }
  return at;
}

/** Whether `cursor` stands past `last` in some shard: an event not applied yet. */
export function advances(cursor, last) {
  const before = positions(last);
  return Object.entries(positions(cursor)).some(([shard, position]) => position > (before[shard] || 0));
}

export { enc };
