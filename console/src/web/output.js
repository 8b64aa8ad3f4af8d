// A session's output pane: output events as lines of styled text (ansi.js),
// and Claude Code's stream-json lines (`--output-format stream-json`) as
// turns and tool calls. Text stays text throughout.

import { AnsiState, render } from './ansi.js';
import { el } from './dom.js';

const STREAM_JSON = new Set(['system', 'assistant', 'user', 'result']);

function brief(value, limit = 2000) {
  const text = typeof value === 'string' ? value : JSON.stringify(value, null, 1);
  return text && text.length > limit ? `${text.slice(0, limit)}…` : text || '';
}

/** A stream-json line as a turn, or null if the line is not one. */
export function streamJsonTurn(line) {
  if (!line.startsWith('{')) return null;
  let item;
  try {
    item = JSON.parse(line);
  } catch (_) {
    return null;
  }
  if (!item || !STREAM_JSON.has(item.type)) return null;
  if (item.type === 'system') {
    return el('div', { class: 'turn turn-system' },
      el('span', { class: 'turn-role', text: `system ${item.subtype || ''}` }),
      item.model ? el('span', { class: 'muted', text: ` model ${item.model}` }) : null);
  }
  if (item.type === 'result') {
    return el('div', { class: 'turn turn-result' },
      el('span', { class: 'turn-role', text: `result ${item.subtype || ''}` }),
      el('div', { class: 'turn-text', text: brief(item.result || '') }));
  }
  const content = item.message && Array.isArray(item.message.content) ? item.message.content : null;
  if (!content) return null;
  const turn = el('div', { class: `turn turn-${item.type}` }, el('span', { class: 'turn-role', text: item.type }));
  for (const block of content) {
    if (!block || typeof block !== 'object') continue;
    if (block.type === 'text') turn.append(el('div', { class: 'turn-text', text: block.text || '' }));
    else if (block.type === 'thinking') turn.append(el('div', { class: 'turn-thinking', text: block.thinking || '' }));
    else if (block.type === 'tool_use') {
      turn.append(el('div', { class: 'tool-call' },
        el('span', { class: 'tool-name', text: `→ ${block.name || 'tool'}` }),
        el('pre', { class: 'tool-input', text: brief(block.input) })));
    } else if (block.type === 'tool_result') {
      turn.append(el('div', { class: block.is_error ? 'tool-result tool-error' : 'tool-result' },
        el('span', { class: 'tool-name', text: '← result' }),
        el('pre', { class: 'tool-output', text: brief(block.content) })));
    }
  }
  return turn;
}

/** The output pane of one session: feed it output events in order. */
export class OutputPane {
  constructor() {
    this.node = el('div', { id: 'output', class: 'output' });
    this.pending = el('span', { class: 'pending' });
    this.node.append(this.pending);
    this.partial = { stdout: '', stderr: '' };
    this.state = { stdout: new AnsiState(), stderr: new AnsiState() };
  }

  line(stream, text) {
    const turn = streamJsonTurn(text);
    const row = turn || el('div', { class: `line line-${stream}` }, render(text, this.state[stream]));
    this.node.insertBefore(row, this.pending);
  }

  /** Appends an `output` event's text: whole lines at once, the rest held. */
  output(stream, text) {
    const key = stream === 'stderr' ? 'stderr' : 'stdout';
    const parts = (this.partial[key] + text).split('\n');
    this.partial[key] = parts.pop();
    for (const part of parts) this.line(key, part);
    const held = this.partial.stdout + this.partial.stderr;
    this.pending.textContent = held.replace(/\x1b\[[0-9;?]*[@-~]/g, ''); // eslint-disable-line no-control-regex
    this.node.scrollTop = this.node.scrollHeight;
  }

  /** A marker where output was dropped. */
  truncated(detail) {
    this.node.insertBefore(el('div', { class: 'line truncated', text: `… ${detail.dropped_bytes} bytes of output dropped …` }), this.pending);
  }
}
