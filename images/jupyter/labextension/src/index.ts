/**
 * gpuhub-lab: GPU JupyterHub inside JupyterLab.
 *
 * A status-bar item (the leased GPUs, their utilisation, when an idle server is
 * culled), a side panel (per-GPU charts, the lease, the user's jobs, the pool's
 * free GPUs per profile) and a warning before an idle cull with a "Keep my
 * server" button.  Everything comes from the `gpuhub_activity` server extension
 * (GET gpuhub/status, POST gpuhub/keep), which asks the hub's gpu-pool service
 * with the server's own token: this code never talks to the hub itself.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';
import { startNotifications } from './notify';

interface IGPU {
  index: number;
  uuid: string;
  model: string;
  memory_mib: number;
  utilization: number | null;
  memory_used_mib: number | null;
  drained: boolean;
}

/** A lease borrowed beyond the user's share (the service's server_reclaim.borrowed_part). */
interface IBorrowed {
  notice: string;
  stops_at: string | null;
  seconds_left: number | null;
}

/** Borrowed GPUs: the notice under the lease, and once they are asked back, when the server stops
 * (the service's own words, with the time left as of its answer). */
function borrowedNotice(borrowed: IBorrowed | null | undefined): HTMLElement | null {
  if (!borrowed) {
    return null;
  }
  return el('p', borrowed.stops_at ? 'gpuhub-borrowed gpuhub-reclaimed' : 'gpuhub-borrowed', borrowed.notice);
}

interface IStatus {
  available: boolean;
  message?: string;
  user?: string;
  server?: string;
  now?: string;
  lease?: {
    id: number;
    since: string;
    gpu_hours: number;
    gpus: IGPU[];
    booked?: string | null;
    borrowed?: IBorrowed | null;
  } | null;
  ended?: { id: number; ended_at: string; reason: string; by_admin: boolean } | null;
  ending?: { reason: string; by_admin: boolean } | null;
  cull?: {
    at: string | null;
    culling: boolean;
    idle_limit_s: number | null;
    check_every_s: number | null;
    last_activity: string | null;
    gpu_idle_rule: { percent: number; seconds: number } | null;
  };
  jobs?: Array<{ id: number; state: string; profile: string; command: string[]; url: string; logs_url: string }> | null;
  free?: { gpus: number; profiles: Array<{ display_name: string; gpus: number; free: number; available: boolean }> };
  pool_url?: string;
  history?: { [uuid: string]: Array<[number, number]> };
  warn_before_s?: number;
  poll_s?: number;
}

// The event the stopping server emits on jupyter-server's event bus (gpuhub_activity/notice.py).
const STOPPING_EVENT = 'urn:gpuhub:lab:server-stopping';
const HISTORY = 600; // seconds of readings the panel's chart spans (the server keeps them)
const BUSY_NOTE =
  'Busy kernels count as activity: while a cell runs, this server is not culled. ' +
  'A kernel waiting for input() or stopped in the debugger does not count.';

function minutesUntil(at: string, now: number): number {
  return Math.max(0, Math.round((Date.parse(at) - now) / 60000));
}

/** "1.2 / 16 GiB": the memory in use of the GPU's total, as the pool page shows it. */
function memoryText(g: IGPU): string {
  if (!g.memory_mib) {
    return '';
  }
  const total = `${(g.memory_mib / 1024).toFixed(0)} GiB`;
  const used = g.memory_used_mib === null || g.memory_used_mib === undefined ? null : g.memory_used_mib;
  return used === null ? ` · ${total}` : ` · ${(used / 1024).toFixed(1)} / ${total}`;
}

function gpuText(g: IGPU): string {
  const util = g.utilization === null ? '?' : `${Math.round(g.utilization)}%`;
  return `GPU ${g.index} ${g.model} · ${util}${memoryText(g)}`;
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Utilisation over the last HISTORY seconds: [unix seconds, percent] points, 0-100 %. */
function sparkline(points: Array<[number, number]>, now: number): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'gpuhub-chart');
  svg.setAttribute('viewBox', `0 0 ${HISTORY} 20`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const xy = points.map(([t, v]) => [Math.max(0, HISTORY - (now - t)), 20 - (Math.min(100, v) / 100) * 20]);
  if (xy.length === 1) {
    xy.unshift([Math.max(0, xy[0][0] - 10), xy[0][1]]); // one reading: a short level line
  }
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' '));
  svg.appendChild(line);
  const title = document.createElementNS(ns, 'title');
  title.textContent = `Utilisation over the last ${HISTORY / 60} minutes`;
  svg.appendChild(title);
  return svg;
}

class Model {
  status: IStatus = { available: false, message: 'Loading…' };
  private listeners: Array<() => void> = [];
  private settings = ServerConnection.makeSettings();

  onChange(fn: () => void): void {
    this.listeners.push(fn);
  }

  private url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'gpuhub', path);
  }

  private take(status: IStatus): void {
    this.status = status;
    this.listeners.forEach(fn => fn());
  }

  async refresh(): Promise<void> {
    try {
      const r = await ServerConnection.makeRequest(this.url('status'), {}, this.settings);
      this.take((await r.json()) as IStatus);
    } catch (e) {
      this.take({ available: false, message: 'The GPU status did not answer' });
    }
  }

  async keep(): Promise<boolean> {
    const r = await ServerConnection.makeRequest(this.url('keep'), { method: 'POST' }, this.settings);
    if (r.ok) {
      this.take((await r.json()) as IStatus);
    }
    return r.ok;
  }
}

class StatusItem extends Widget {
  constructor(private model: Model, open: () => void) {
    super();
    this.id = 'gpuhub-status';
    this.addClass('gpuhub-status');
    this.node.title = 'Your GPUs and idle culling (click for details)';
    this.node.addEventListener('click', open);
    model.onChange(() => this.render());
    this.render();
  }

  render(): void {
    const s = this.model.status;
    const parts: string[] = [];
    if (!s.available) {
      parts.push(s.message ?? 'GPU status unavailable');
    } else {
      const gpus = s.lease?.gpus ?? [];
      parts.push(gpus.length ? gpus.map(gpuText).join(' | ') : 'no GPU');
      if (s.cull?.at) {
        parts.push(`culled in ${minutesUntil(s.cull.at, Date.now())} min if idle`);
      }
    }
    this.node.textContent = parts.join(' · ');
    this.node.dataset.deadline = s.cull?.at ?? '';
    this.node.dataset.gpus = (s.lease?.gpus ?? []).map(g => g.uuid).join(',');
  }
}

class Panel extends Widget {
  constructor(private model: Model) {
    super();
    this.id = 'gpuhub-panel';
    this.addClass('gpuhub-panel');
    this.title.caption = 'GPUs and idle culling';
    this.title.label = 'GPUs';
    model.onChange(() => this.render());
    this.render();
  }

  render(): void {
    const s = this.model.status;
    const node = this.node;
    node.textContent = '';
    node.appendChild(el('h2', '', 'Your GPUs'));
    if (!s.available) {
      node.appendChild(el('p', 'gpuhub-message', s.message ?? 'GPU status unavailable'));
      return;
    }
    const lease = s.lease;
    if (!lease) {
      node.appendChild(el('p', 'gpuhub-nogpu', 'no GPU: this server runs on CPUs only.'));
    } else {
      const since = new Date(lease.since);
      node.appendChild(
        el('p', 'gpuhub-lease', `Lease ${lease.id} since ${since.toLocaleString()}: ${lease.gpu_hours.toFixed(2)} GPU-hours so far.`)
      );
      const borrowed = borrowedNotice(lease.borrowed);
      if (borrowed) {
        node.appendChild(borrowed);
      }
      if (lease.booked) {
        // Booked later for someone else: when, and how long this server has (the pool's own words).
        node.appendChild(el('p', 'gpuhub-booked', lease.booked));
      }
      for (const g of lease.gpus) {
        const row = el('div', 'gpuhub-gpu');
        row.dataset.uuid = g.uuid;
        row.appendChild(el('div', 'gpuhub-gpu-name', gpuText(g) + (g.drained ? ' · drained by an admin' : '')));
        row.appendChild(sparkline(s.history?.[g.uuid] ?? [], Date.now() / 1000));
        row.appendChild(el('div', 'gpuhub-chart-caption', 'utilisation, last 10 minutes'));
        node.appendChild(row);
      }
    }
    node.appendChild(el('h2', '', 'Idle culling'));
    const cull = s.cull;
    if (!cull?.culling) {
      node.appendChild(el('p', '', 'This hub does not cull idle servers.'));
    } else if (cull.at) {
      const at = new Date(cull.at);
      node.appendChild(
        el('p', 'gpuhub-cull', `If it stays idle, this server is culled at ${at.toLocaleTimeString()} (in ${minutesUntil(cull.at, Date.now())} min).`)
      );
    } else {
      node.appendChild(el('p', 'gpuhub-cull', 'No activity recorded yet.'));
    }
    node.appendChild(el('p', 'gpuhub-busy-note', BUSY_NOTE));
    if (cull?.gpu_idle_rule) {
      const rule = cull.gpu_idle_rule;
      node.appendChild(
        el('p', 'gpuhub-gpu-rule', `It is also culled when its GPUs stay under ${rule.percent}% for ${Math.round(rule.seconds / 60)} min, whatever else happens in it.`)
      );
    }
    if (cull?.culling) {
      const keep = el('button', 'jp-mod-styled jp-mod-accept gpuhub-keep', 'Keep my server');
      keep.addEventListener('click', () => void this.model.keep());
      node.appendChild(keep);
    }
    if (s.jobs) {
      node.appendChild(el('h2', '', 'Your jobs'));
      if (!s.jobs.length) {
        node.appendChild(el('p', '', 'No queued or running jobs (gpu-job submit in a terminal).'));
      }
      const list = el('ul', 'gpuhub-jobs');
      for (const j of s.jobs) {
        const item = el('li', '');
        const link = el('a', '', `Job ${j.id}`);
        link.href = j.url;
        link.target = '_blank';
        item.appendChild(link);
        item.appendChild(document.createTextNode(` ${j.state} (${j.profile}): ${j.command.join(' ')} `));
        const logs = el('a', '', 'logs');
        logs.href = j.logs_url;
        logs.target = '_blank';
        item.appendChild(logs);
        list.appendChild(item);
      }
      node.appendChild(list);
    }
    node.appendChild(el('h2', '', 'The pool'));
    const free = s.free;
    node.appendChild(el('p', 'gpuhub-free', `${free?.gpus ?? 0} GPU(s) free now.`));
    const profiles = el('ul', 'gpuhub-profiles');
    for (const p of free?.profiles ?? []) {
      profiles.appendChild(el('li', '', `${p.display_name}: ${p.free} GPU(s) free for it, ` +
        `${p.available ? 'can start now' : 'would wait'}`));
    }
    node.appendChild(profiles);
    if (s.pool_url) {
      const link = el('a', '', 'Open the GPU pool page');
      link.href = s.pool_url;
      link.target = '_blank';
      node.appendChild(link);
    }
  }
}

/** Warnings before an idle cull, and notices of what an admin did to the lease. */
class Warnings {
  private warnedFor = '';
  private toast = '';
  private drainedSeen = new Set<string>();
  private endedSeen = new Set<number>();
  private bookedSeen = '';
  private reclaimSeen = '';
  private stoppingShown = false;

  constructor(private model: Model) {
    model.onChange(() => this.check());
  }

  /** The server is stopping because its lease was ended (the event it sends as it stops, or a poll
   * that caught the reason first): said once. */
  stopping(message: string): void {
    if (this.stoppingShown) {
      return;
    }
    this.stoppingShown = true;
    this.dismiss();
    Notification.error(message, { autoClose: false });
  }

  private check(): void {
    const s = this.model.status;
    if (!s.available) {
      return;
    }
    const at = s.cull?.at;
    const before = (s.warn_before_s ?? 600) * 1000;
    if (at && Date.parse(at) - Date.now() <= before) {
      if (this.warnedFor !== at) {
        this.dismiss();
        this.warnedFor = at;
        const minutes = minutesUntil(at, Date.now());
        this.toast = Notification.warning(
          `This server is idle and will be culled in ${minutes} min (unsaved work is lost). Busy kernels count as activity.`,
          {
            autoClose: false,
            actions: [{ label: 'Keep my server', displayType: 'accent', callback: () => void this.model.keep() }]
          }
        );
      }
    } else if (this.toast) {
      this.dismiss();
    }
    this.reclaimed(s.lease?.borrowed);
    const booked = s.lease?.booked;
    if (booked && booked.split(',')[0] !== this.bookedSeen) {
      // Said once per booking (its start), not again as the minutes left count down.
      this.bookedSeen = booked.split(',')[0];
      Notification.warning(booked, { autoClose: false });
    }
    for (const g of s.lease?.gpus ?? []) {
      if (g.drained && !this.drainedSeen.has(g.uuid)) {
        this.drainedSeen.add(g.uuid);
        Notification.info(
          `An admin drained GPU ${g.index} for maintenance: you keep it until this server stops, then it is not lent again until undrained.`,
          { autoClose: false }
        );
      }
    }
    if (s.ending?.by_admin) {
      this.stopping('An admin ended the GPU lease of this server: it is stopping now (unsaved work is lost).');
    }
    const ended = s.ended;
    if (ended && !this.endedSeen.has(ended.id) && !(ended.by_admin && this.stoppingShown)) {
      this.endedSeen.add(ended.id);
      Notification.error(
        ended.by_admin
          ? 'An admin ended the GPU lease of this server: save your work, the server is stopping.'
          : `The GPU lease of this server ended (${ended.reason}).`,
        { autoClose: false }
      );
    }
  }

  /** Borrowed GPUs asked back: said once per reclaim (its stop time), before the server stops. */
  private reclaimed(borrowed: IBorrowed | null | undefined): void {
    if (borrowed?.stops_at && borrowed.stops_at !== this.reclaimSeen) {
      this.reclaimSeen = borrowed.stops_at;
      Notification.warning(borrowed.notice, { autoClose: false });
    }
  }

  private dismiss(): void {
    if (this.toast) {
      Notification.dismiss(this.toast);
      this.toast = '';
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuhub-lab:plugin',
  description: 'Your GPUs, how busy they are, and when an idle server is culled',
  autoStart: true,
  optional: [IStatusBar, ILabShell],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null, shell: ILabShell | null) => {
    const model = new Model();
    const panel = new Panel(model);
    app.shell.add(panel, 'right', { rank: 900 });
    const open = () => (shell ? shell.activateById(panel.id) : app.shell.activateById(panel.id));
    if (statusBar) {
      statusBar.registerStatusItem('gpuhub-lab:status', {
        item: new StatusItem(model, open),
        align: 'left',
        rank: 900
      });
    }
    const warnings = new Warnings(model);
    // The server says why it stops while the tab's event socket still stands (it is gone after).
    app.serviceManager.events.stream.connect((_, event) => {
      const e = event as { schema_id: string; message?: string };
      if (e.schema_id === STOPPING_EVENT && e.message) {
        warnings.stopping(e.message);
      }
    });
    let timer = 0;
    const schedule = () => {
      const every = (model.status.poll_s ?? 10) * (document.hidden ? 6 : 1);
      timer = window.setTimeout(tick, every * 1000);
    };
    const tick = async () => {
      await model.refresh();
      schedule();
    };
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden) {
        window.clearTimeout(timer);
        void tick();
      }
    });
    void app.restored.then(tick);
    // Notifications outside the tab (notify.ts): one poller per browser, where allowed.
    void app.restored.then(() => startNotifications(() => model.status.pool_url ?? null));
  }
};

export default plugin;
