// Building the page: every value goes into the DOM as text (textContent / text nodes /
// attribute values), never as markup, so a queue named <img src=x onerror=...> shows as
// those characters (UI1).

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'selected') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  add(el, children);
  return el;
}

function add(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) add(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function text(el, value) {
  el.textContent = value === undefined || value === null ? '' : String(value);
  return el;
}

export const enc = encodeURIComponent;

export function link(href, label) {
  return h('a', { href }, label);
}

export function queueHref(vhost, name) { return `#/queues/${enc(vhost)}/${enc(name)}`; }
export function exchangeHref(vhost, name) { return `#/exchanges/${enc(vhost)}/${enc(name === '' ? 'amq.default' : name)}`; }
export function connectionHref(name) { return `#/connections/${enc(name)}`; }

export function num(n) {
  if (n === undefined || n === null || n === '') return '';
  return typeof n === 'number' ? n.toLocaleString('en') : String(n);
}

export function rate(obj) {
  const r = obj && obj.rate;
  return r === undefined || r === null ? '' : `${Number(r).toFixed(1)}/s`;
}

// RabbitMQ's feature letters: D durable, AD auto-delete, Excl exclusive, I internal; then
// the argument names.
export function features(o) {
  const f = [];
  if (o.durable) f.push('D');
  if (o.auto_delete) f.push('AD');
  if (o.exclusive) f.push('Excl');
  if (o.internal) f.push('I');
  return [...f, ...Object.keys(o.arguments || {})].join(' ');
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export function bytes(n) {
  if (typeof n !== 'number') return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function when(ms) {
  if (!ms) return '';
  const d = new Date(typeof ms === 'number' && ms < 1e12 ? ms * 1000 : ms);
  return isNaN(d) ? String(ms) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

// A sortable table. columns: [{key, label, sort?: server/field key, value(row) -> text|Node,
// num?: bool}]; state: {sort, reverse}; onSort(key) when a sortable header is chosen.
export function table(columns, rows, { sort, reverse, onSort, empty = 'Nothing to show.', id } = {}) {
  const head = h('tr', null, columns.map((c) => {
    const label = c.label + (sort && sort === c.sort ? (reverse ? ' ▼' : ' ▲') : '');
    if (c.sort && onSort) {
      return h('th', { scope: 'col', class: c.num ? 'num' : null, 'aria-sort': sort === c.sort ? (reverse ? 'descending' : 'ascending') : null },
        h('button', { type: 'button', class: 'sort', onclick: () => onSort(c.sort) }, label));
    }
    return h('th', { scope: 'col', class: c.num ? 'num' : null }, label);
  }));
  const body = h('tbody');
  if (!rows.length) body.appendChild(h('tr', null, h('td', { colspan: columns.length, class: 'empty' }, empty)));
  for (const row of rows) {
    body.appendChild(h('tr', null, columns.map((c) => {
      const v = c.value ? c.value(row) : row[c.key];
      return h('td', { class: c.num ? 'num' : null }, v instanceof Node ? v : (typeof v === 'number' ? num(v) : v));
    })));
  }
  return h('table', { class: 'list', id }, h('thead', null, head), body);
}

// name -> value pairs as a definition list (a details panel).
export function details(pairs) {
  return h('dl', { class: 'details' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', null, k),
    h('dd', null, v instanceof Node ? v : (typeof v === 'number' ? num(v) : (v === undefined || v === null ? '' : String(v))))]));
}

export function section(title, ...children) {
  return h('section', { class: 'panel' }, h('h2', null, title), children);
}

export function button(label, onclick, cls) {
  return h('button', { type: 'button', class: cls || null, onclick }, label);
}

// A labelled form field.
export function field(label, input) {
  return h('label', { class: 'field' }, h('span', null, label), input);
}

export function select(name, options, value) {
  return h('select', { name }, options.map((o) => {
    const [v, l] = Array.isArray(o) ? o : [o, o];
    return h('option', { value: v, selected: v === value }, l);
  }));
}

export function pre(value) {
  return h('pre', null, typeof value === 'string' ? value : json(value));
}

// Swap a placeholder's content for new nodes.
export function fill(el, ...children) {
  el.replaceChildren();
  add(el, children);
  return el;
}

export function downloadText(filename, textValue, type) {
  const url = URL.createObjectURL(new Blob([textValue], { type }));
  const a = h('a', { href: url, download: filename, hidden: true });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
