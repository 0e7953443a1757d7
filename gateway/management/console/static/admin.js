// Admin: users, virtual hosts (with their CMQ profile), permissions, policies, definitions.
// Each is what the API allows the user; a refusal shows the API's reason.
import { api, get } from './api.js';
import { button, downloadText, enc, field, fill, h, json, section, select, table } from './dom.js';

const TABS = [['users', 'Users'], ['vhosts', 'Virtual hosts'], ['permissions', 'Permissions'], ['policies', 'Policies'], ['definitions', 'Definitions']];

function form(id, fields, label, onsubmit, ctx) {
  const f = h('form', { class: 'inline-form', id }, fields, h('button', { type: 'submit' }, label));
  f.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try { await onsubmit(); } catch (e) { ctx.flash(`${label} failed: ${e.message}`, 'error'); }
  });
  return f;
}

function refused(body, e) {
  fill(body, h('p', { class: 'error' }, `Not available: ${e.message}`));
}

function usersTab(ctx) {
  const body = h('div', { id: 'admin-users' });
  const name = h('input', { name: 'username', required: true });
  const password = h('input', { name: 'password', type: 'password', autocomplete: 'new-password' });
  const tags = h('input', { name: 'tags', placeholder: 'administrator, monitoring, management' });
  const add = form('add-user', [field('Username', name), field('Password', password), field('Tags', tags)], 'Add / update user', async () => {
    const b = { tags: tags.value };
    if (password.value) b.password = password.value;
    await api('PUT', `/api/users/${enc(name.value)}`, b);
    ctx.flash(`User ${name.value} saved.`);
    password.value = '';
    refresh();
  }, ctx);
  async function refresh() {
    let users;
    try { users = await get('/api/users'); } catch (e) { refused(body, e); return; }
    fill(body, table([
      { key: 'name', label: 'Name' },
      { key: 'tags', label: 'Tags', value: (u) => (Array.isArray(u.tags) ? u.tags.join(', ') : u.tags) },
      { key: 'pw', label: 'Can log in with password', value: (u) => (u.password_hash ? 'yes' : 'no') },
      { key: 'del', label: '', value: (u) => button('Delete', async () => {
        if (!confirm(`Delete user "${u.name}"?`)) return;
        try { await api('DELETE', `/api/users/${enc(u.name)}`); ctx.flash(`User ${u.name} deleted.`); refresh(); } catch (e) { ctx.flash(`Delete failed: ${e.message}`, 'error'); }
      }, 'danger') },
    ], users, { id: 'users-list' }), section('Add or update a user', add));
  }
  return { el: body, refresh };
}

function vhostsTab(ctx) {
  const body = h('div', { id: 'admin-vhosts' });
  const name = h('input', { name: 'vhost', required: true });
  const add = form('add-vhost', [field('Name', name)], 'Add virtual host', async () => {
    await api('PUT', `/api/vhosts/${enc(name.value)}`, {});
    ctx.flash(`Virtual host ${name.value} added.`);
    name.value = '';
    refresh();
  }, ctx);
  async function refresh() {
    const vhosts = await get('/api/vhosts');
    fill(body, table([
      { key: 'name', label: 'Name' },
      { key: 'cmq_profile', label: 'CMQ profile', value: (v) => {
        const s = select('profile', [['cmq', 'cmq'], ['compatible', 'compatible']], v.cmq_profile);
        s.addEventListener('change', async () => {
          try { await api('PUT', `/api/cmq/vhosts/${enc(v.name)}/profile`, { profile: s.value }); ctx.flash(`Profile of ${v.name}: ${s.value}.`); } catch (e) { ctx.flash(`Profile change failed: ${e.message}`, 'error'); s.value = v.cmq_profile; }
        });
        return s;
      } },
      { key: 'messages_ready', label: 'Ready', num: true },
      { key: 'messages_unacknowledged', label: 'Unacked', num: true },
      { key: 'del', label: '', value: (v) => button('Delete', async () => {
        if (!confirm(`Delete virtual host "${v.name}" and everything in it?`)) return;
        try { await api('DELETE', `/api/vhosts/${enc(v.name)}`); ctx.flash(`Virtual host ${v.name} deleted.`); refresh(); } catch (e) { ctx.flash(`Delete failed: ${e.message}`, 'error'); }
      }, 'danger') },
    ], vhosts, { id: 'vhosts-list' }), section('Add a virtual host', add));
  }
  return { el: body, refresh };
}

function permissionsTab(ctx) {
  const body = h('div', { id: 'admin-permissions' });
  const user = h('input', { name: 'user', required: true });
  const vhost = h('input', { name: 'vhost', value: ctx.vhost || '/' });
  const conf = h('input', { name: 'configure', value: '.*' });
  const write = h('input', { name: 'write', value: '.*' });
  const read = h('input', { name: 'read', value: '.*' });
  const set = form('set-permission', [field('User', user), field('Virtual host', vhost), field('Configure', conf), field('Write', write), field('Read', read)], 'Set permission', async () => {
    await api('PUT', `/api/permissions/${enc(vhost.value)}/${enc(user.value)}`, { configure: conf.value, write: write.value, read: read.value });
    ctx.flash('Permission set.');
    refresh();
  }, ctx);
  async function refresh() {
    let perms;
    try { perms = await get('/api/permissions'); } catch (e) { refused(body, e); return; }
    fill(body, table([
      { key: 'user', label: 'User' }, { key: 'vhost', label: 'Virtual host' },
      { key: 'configure', label: 'Configure' }, { key: 'write', label: 'Write' }, { key: 'read', label: 'Read' },
      { key: 'del', label: '', value: (p) => button('Clear', async () => {
        try { await api('DELETE', `/api/permissions/${enc(p.vhost)}/${enc(p.user)}`); ctx.flash('Permission cleared.'); refresh(); } catch (e) { ctx.flash(`Clear failed: ${e.message}`, 'error'); }
      }) },
    ], perms.filter((p) => !ctx.vhost || p.vhost === ctx.vhost), { id: 'permissions-list' }), section('Set a permission', set));
  }
  return { el: body, refresh };
}

function policiesTab(ctx) {
  const body = h('div', { id: 'admin-policies' });
  const name = h('input', { name: 'name', required: true });
  const vhost = h('input', { name: 'vhost', value: ctx.vhost || '/' });
  const pattern = h('input', { name: 'pattern', required: true });
  const applyTo = select('apply-to', ['queues', 'exchanges', 'all'], 'queues');
  const priority = h('input', { name: 'priority', type: 'number', value: '0' });
  const definition = h('textarea', { name: 'definition', rows: 3, placeholder: '{"max-length": 1000}' });
  const add = form('add-policy', [field('Virtual host', vhost), field('Name', name), field('Pattern', pattern), field('Apply to', applyTo),
    field('Priority', priority), field('Definition (JSON)', definition)], 'Add / update policy', async () => {
    await api('PUT', `/api/policies/${enc(vhost.value)}/${enc(name.value)}`, {
      pattern: pattern.value, 'apply-to': applyTo.value, priority: Number(priority.value), definition: JSON.parse(definition.value || '{}'),
    });
    ctx.flash(`Policy ${name.value} saved.`);
    refresh();
  }, ctx);
  async function refresh() {
    const policies = await get(ctx.vhost ? `/api/policies/${enc(ctx.vhost)}` : '/api/policies');
    fill(body, table([
      { key: 'vhost', label: 'Virtual host' }, { key: 'name', label: 'Name' }, { key: 'pattern', label: 'Pattern' },
      { key: 'apply-to', label: 'Apply to' }, { key: 'definition', label: 'Definition', value: (p) => json(p.definition) },
      { key: 'priority', label: 'Priority', num: true },
      { key: 'del', label: '', value: (p) => button('Delete', async () => {
        if (!confirm(`Delete policy "${p.name}"?`)) return;
        try { await api('DELETE', `/api/policies/${enc(p.vhost)}/${enc(p.name)}`); ctx.flash('Policy deleted.'); refresh(); } catch (e) { ctx.flash(`Delete failed: ${e.message}`, 'error'); }
      }, 'danger') },
    ], policies, { id: 'policies-list' }), section('Add or update a policy', add));
  }
  return { el: body, refresh };
}

function definitionsTab(ctx) {
  const status = h('p', { id: 'definitions-status', role: 'status' });
  const file = h('input', { type: 'file', id: 'definitions-file', accept: '.json,application/json' });
  const download = button('Download broker definitions', async () => {
    try {
      const raw = await api('GET', ctx.vhost ? `/api/definitions/${enc(ctx.vhost)}` : '/api/definitions', undefined, { raw: true });
      downloadText('definitions.json', raw, 'application/json');
      fill(status, 'Definitions downloaded.');
    } catch (e) { fill(status, `Download failed: ${e.message}`); }
  });
  download.id = 'definitions-download';
  const upload = form('definitions-upload', [field('Definitions file', file)], 'Upload definitions', async () => {
    if (!file.files.length) throw new Error('choose a file first');
    const textValue = await file.files[0].text();
    try { JSON.parse(textValue); } catch { throw new Error('the file is not JSON'); }
    const report = await api('POST', ctx.vhost ? `/api/definitions/${enc(ctx.vhost)}` : '/api/definitions', textValue);
    // The import's report: what was new, what was already there, what could not be imported.
    const counts = (o) => Object.entries(o || {}).filter(([, n]) => n).map(([k, n]) => `${n} ${n === 1 ? k.replace(/s$/, '') : k}`).join(', ') || 'nothing';
    fill(status, `Definitions imported: ${counts(report && report.imported)}; unchanged: ${counts(report && report.unchanged)}.`,
      report && report.not_imported && report.not_imported.length ? h('pre', null, json(report.not_imported)) : null,
      report && report.notes && report.notes.length ? h('pre', null, json(report.notes)) : null);
  }, { flash: (m) => fill(status, m) });
  return { el: h('div', { id: 'admin-definitions' }, section('Export', download), section('Import', upload), status), refresh: null };
}

export function adminView(ctx, tab) {
  const active = TABS.some(([id]) => id === tab) ? tab : 'users';
  const inner = { users: usersTab, vhosts: vhostsTab, permissions: permissionsTab, policies: policiesTab, definitions: definitionsTab }[active](ctx);
  const el = h('div', { id: 'admin' }, h('h1', null, 'Admin'),
    h('nav', { class: 'subnav', 'aria-label': 'Admin views' }, TABS.map(([id, l]) => h('a', { href: `#/admin/${id}`, 'aria-current': id === active ? 'page' : null }, l))),
    inner.el);
  return { el, refresh: inner.refresh, title: `Admin ${active}` };
}
