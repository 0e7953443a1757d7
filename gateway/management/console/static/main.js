// The console's shell: login, navigation, the vhost and refresh selectors, and the router
// (the view is the URL's #fragment: nothing secret ever goes in the URL).
import { api, ApiError, forget, get, remember, session, tokenFor, whenLoggedOut } from './api.js';
import { fill, h, text } from './dom.js';
import { overviewView } from './overview.js';
import { queuesView, queueView } from './queues.js';
import { exchangesView, exchangeView } from './exchanges.js';
import { channelsView, channelView, connectionsView, connectionView } from './connections.js';
import { adminView } from './admin.js';
import { cmqView } from './cmq.js';

const MANAGEMENT_TAGS = ['management', 'policymaker', 'monitoring', 'administrator'];
const NAV = [
  ['overview', 'Overview'], ['connections', 'Connections'], ['channels', 'Channels'],
  ['exchanges', 'Exchanges'], ['queues', 'Queues'], ['admin', 'Admin'], ['cmq', 'CMQ'],
];

const $ = (id) => document.getElementById(id);
const ctx = {
  user: null,
  vhost: sessionStorage.getItem('cmq-console-vhost') || '',
  flash,
  go(hash) { if (location.hash === hash) route(); else location.hash = hash; },
};
let current = null; // {name, view}
let timer = null;
let busy = null; // the view whose refresh is under way

function flash(message, kind = 'info') {
  const el = $('flash');
  text(el, message || '');
  el.className = message ? kind : '';
}

function showLogin(message) {
  forget();
  ctx.user = null;
  stopTimer();
  current = null;
  fill($('main'));
  $('app').hidden = true;
  $('login').hidden = false;
  text($('login-error'), message || '');
  $('login-password').value = '';
  $('login-user').focus();
}

async function login(user, token) {
  // GET /api/whoami answers 401 to a wrong password (not_authorized) and to a user without
  // a management tag (not_authorised, "Not management user"), as RabbitMQ's login does.
  const me = await api('GET', '/api/whoami', undefined, { token });
  if (!me.tags.some((t) => MANAGEMENT_TAGS.includes(t))) throw new ApiError(401, 'not_authorised', 'Not management user');
  remember(user, token);
  ctx.user = me;
  await start();
}

function loginFailure(e) {
  if (e instanceof ApiError && e.error === 'not_authorised') {
    return `Login refused: ${e.reason || 'not a management user'}. The console needs the management, policymaker, monitoring or administrator tag.`;
  }
  if (e instanceof ApiError && e.status === 401) return 'Login failed: wrong user name or password.';
  return `Login failed: ${e.message}`;
}

async function start() {
  $('login').hidden = true;
  $('app').hidden = false;
  text($('whoami'), `User ${ctx.user.name}${ctx.user.tags.length ? ` (${ctx.user.tags.join(', ')})` : ''}`);
  fill($('nav'), NAV.map(([id, label]) => h('a', { href: `#/${id}`, 'data-view': id }, label)));
  const interval = sessionStorage.getItem('cmq-console-refresh') || '5';
  $('refresh-select').value = interval;
  await loadVhosts();
  route();
}

async function loadVhosts() {
  let names = [];
  try { names = (await get('/api/vhosts')).map((v) => v.name); } catch (e) { flash(e.message, 'error'); }
  if (ctx.vhost && !names.includes(ctx.vhost)) ctx.vhost = '';
  fill($('vhost-select'), h('option', { value: '' }, 'All'), names.map((n) => h('option', { value: n, selected: n === ctx.vhost }, n)));
  $('vhost-select').value = ctx.vhost;
}

function parseHash() {
  const parts = (location.hash.replace(/^#\/?/, '') || 'overview').split('/').map((p) => {
    try { return decodeURIComponent(p); } catch { return p; }
  });
  return parts;
}

function route() {
  if (!ctx.user) return;
  const [name, ...args] = parseHash();
  let view;
  switch (name) {
    case 'connections': view = args.length ? connectionView(ctx, args[0]) : connectionsView(ctx); break;
    case 'channels': view = args.length ? channelView(ctx, args[0]) : channelsView(ctx); break;
    case 'exchanges': view = args.length >= 2 ? exchangeView(ctx, args[0], args[1]) : exchangesView(ctx); break;
    case 'queues': view = args.length >= 2 ? queueView(ctx, args[0], args[1]) : queuesView(ctx); break;
    case 'admin': view = adminView(ctx, args[0]); break;
    case 'cmq': view = cmqView(ctx, args[0]); break;
    default: view = overviewView(ctx);
  }
  const navName = NAV.some(([id]) => id === name) ? name : 'overview';
  for (const a of $('nav').querySelectorAll('a')) {
    if (a.dataset.view === navName) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (current && current.view.destroy) current.view.destroy();
  current = { name, view };
  flash('');
  fill($('main'), view.el);
  document.title = `${view.title || navName} - cmq-gateway`;
  refreshNow();
  restartTimer();
}

async function refreshNow() {
  // One refresh at a time per view: a slow answer is not asked again on top of itself, and a
  // view just opened does not wait for the previous view's refresh.
  if (!current || !current.view.refresh || busy === current.view) return;
  const view = current.view;
  busy = view;
  try {
    await view.refresh();
  } catch (e) {
    if (current && current.view === view) flash(e.message, 'error');
  } finally {
    if (busy === view) busy = null;
  }
}

function stopTimer() { if (timer) clearInterval(timer); timer = null; }

function restartTimer() {
  stopTimer();
  const seconds = Number($('refresh-select').value);
  if (seconds > 0) timer = setInterval(refreshNow, seconds * 1000);
}

function init() {
  whenLoggedOut(showLogin);
  $('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const user = $('login-user').value;
    const token = tokenFor(user, $('login-password').value);
    text($('login-error'), '');
    try { await login(user, token); } catch (e) { forget(); text($('login-error'), loginFailure(e)); }
  });
  $('logout').addEventListener('click', () => { showLogin('Logged out.'); location.hash = ''; });
  $('vhost-select').addEventListener('change', () => {
    ctx.vhost = $('vhost-select').value;
    sessionStorage.setItem('cmq-console-vhost', ctx.vhost);
    route();
  });
  $('refresh-select').addEventListener('change', () => {
    sessionStorage.setItem('cmq-console-refresh', $('refresh-select').value);
    restartTimer();
  });
  window.addEventListener('hashchange', route);
  const s = session();
  if (s) {
    login(s.user, s.token).catch((e) => showLogin(loginFailure(e)));
  } else {
    showLogin('');
  }
}

init();
