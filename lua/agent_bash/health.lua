-- :checkhealth agent_bash — what a bug report needs: versions, paths, log file, a live ping.

local M = {}
local H = {}

function M.check()
  local health = vim.health
  local plugin = require('agent_bash')
  local backend = require('agent_bash.backend')

  health.start('agent-bash: Neovim')
  local v = vim.version()
  local nvim = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.10') == 1 then
    health.ok(('Neovim %s (0.10 or newer required)'):format(nvim))
  else
    health.error(('Neovim %s is too old: agent-bash needs 0.10 or newer'):format(nvim))
  end
  health.info('plugin version ' .. plugin.version .. ', root ' .. backend.root())
  local ok, err = pcall(require('agent_bash.config').setup, {})
  if ok then
    health.ok('configuration is valid')
  else
    health.error(tostring(err))
  end
  if H.help_tagged() then
    health.ok(':help agent_bash: tags found')
  else
    health.warn(':help agent_bash: no help tags yet', { ':lua require("agent_bash.help").generate(require("agent_bash.backend").root())' })
  end

  health.start('agent-bash: backend')
  local bin, berr = backend.bin()
  if not bin then
    if require('agent_bash.config').options.bin then
      health.error(berr or 'backend binary not found', { "set the path: require('agent_bash').setup({ bin = '/path/to/agent-bash' })" })
    else
      -- How to build it for the way the plugin was installed (lua/agent_bash/build.lua).
      local advice = require('agent_bash.build').advice()
      table.insert(advice, "or set the path: require('agent_bash').setup({ bin = '/path/to/agent-bash' })")
      health.error(('agent-bash binary not found (looked at %s/target/release/agent-bash and $PATH)'):format(backend.root()), advice)
    end
  else
    health.ok('binary: ' .. bin)
    local out = vim.fn.system({ bin, '--version' })
    if vim.v.shell_error == 0 then
      health.ok('version: ' .. vim.trim(out))
    else
      health.error(('`%s --version` failed (exit %d): %s'):format(bin, vim.v.shell_error, vim.trim(out)))
    end
  end
  health.info('log file: ' .. require('agent_bash.log').file())
  health.info('session id: ' .. backend.session_id())
  -- The health buffer is current here: only the global variable can be reported.
  local profile = vim.g.agent_bash_profile
  if type(profile) == 'string' and profile ~= '' then
    health.info('bang commands run under the remote profile: ' .. profile .. ' (g:agent_bash_profile; a buffer\'s b:agent_bash_profile overrides it)')
  else
    health.info('bang commands: no g:agent_bash_profile, so the settings file decides ([profile_by_key] bang, else default_profile; this machine when neither is set); a buffer\'s b:agent_bash_profile overrides it')
  end
  H.settings(health, backend, bin)

  if bin then
    H.ping(health, backend)
  end

  H.changes(health, backend)
  H.mirror(health)
end

--- Change receipts, undo and diff (contract §13): the git they need, and whether they are on.
function H.changes(health, backend)
  health.start('agent-bash: change receipts (:AgentBashUndo, :AgentBashDiff)')
  local info = backend.info()
  local on = info.changes
  -- The program the backend runs: `[changes] git` of the settings file, else `git` on PATH.
  local git = type(info.git) == 'string' and info.git or 'git'
  if vim.fn.executable(git) == 1 then
    local out = vim.fn.system({ git, '--version' })
    health.ok('git: ' .. vim.trim(out) .. ' (' .. vim.fn.exepath(git) .. ')')
  elseif on ~= false then
    local where = git == 'git' and 'git not found on PATH' or ('git not found: ' .. git .. ' ([changes] git)')
    health.warn(where .. ': results say `changes_unavailable` and nothing can be undone', {
      'install git, or name it in the settings file: [changes] git = "/path/to/git"',
    })
  end
  if on == true then
    health.ok('receipts are on (settings file: [changes] enabled = false turns them off)')
    local limit = vim.fn.filereadable('/proc/sys/fs/inotify/max_user_watches') == 1
      and vim.trim(vim.fn.readfile('/proc/sys/fs/inotify/max_user_watches')[1] or '')
    if info.changes_watch then
      health.ok(('only changed folders are re-read: inotify watches the project folders (limit: fs.inotify.max_user_watches = %s)'):format(limit or '?'))
    elseif info.portable then
      health.info(('every snapshot reads the whole project: no folder watcher on %s'):format(tostring(info.platform)))
    else
      health.info('every snapshot reads the whole project ([changes] watch = false)')
    end
  elseif on == false then
    health.info('receipts are off ([changes] enabled = false in the settings file)')
  else
    health.info('receipts: unknown until the backend runs')
  end
  if on == true and info.chan then
    H.projects(health)
  end
end

--- The projects the backend has taken receipts in: ready, being indexed (how far), or off and why.
function H.projects(health)
  local list = require('agent_bash.changes').status()
  if not list then
    health.warn('projects: the backend did not say (see the log file)')
    return
  end
  if #list == 0 then
    health.info('projects: none yet (a project\'s receipts start with its first run)')
  end
  for _, p in ipairs(list) do
    local by = p.engine and ('shared engine, pid %d'):format(p.engine) or "this backend's own snapshots"
    local line = ('%s: %s (%s)'):format(p.root, p.note, by)
    if p.state == 'ready' then
      health.ok(line)
    elseif p.state == 'off' then
      health.warn(line, {
        'receipts come back once the project\'s engine restarts: it ends 5 s after every backend using it has gone (:AgentBashRestart restarts this one)',
        'the limits are [changes] max_files, max_bytes and max_snapshot_ms in the settings file; a first snapshot may take at most 120 s',
      })
    else
      health.info(line)
    end
  end
end

-- Helpers -----------------------------------------------------------------------------------

--- The settings file, as the backend reads it: a file the backend refuses is an ERROR with the
--- backend's own text (it is what keeps every command from running).
function H.settings(health, backend, bin)
  local settings = require('agent_bash.config').options.settings_file
  if not settings then
    health.info('settings file: none (option settings_file)')
    return
  end
  local path = vim.fn.expand(settings)
  if vim.fn.filereadable(path) ~= 1 then
    health.error('settings file is not readable: ' .. settings)
    return
  end
  if not bin then
    health.info('settings file: ' .. settings .. ' (not read yet: no backend binary)')
    return
  end
  local chan, err = backend.ensure()
  if chan then
    health.ok('settings file: ' .. settings .. ' (read by the running backend)')
  elseif tostring(err):find(path, 1, true) then
    health.error('settings file ' .. settings .. ': ' .. tostring(err), {
      'fix the file, then :AgentBashRestart (the backend reads it again)',
    })
  else
    health.warn('settings file: ' .. settings .. ' (not read: the backend did not start)')
  end
end

--- The MCP servers (`agent-bash mcp`) that show their calls in this editor (contract §11).
function H.mirror(health)
  health.start('agent-bash: MCP servers mirrored here')
  local mirror = require('agent_bash.mirror')
  local address = vim.v.servername
  if address ~= nil and address ~= '' then
    health.info(('discovery: %s/%d.json (address %s)'):format(mirror.registry_dir(), vim.fn.getpid(), address))
  else
    health.warn('this editor has no RPC address: MCP servers can only find it through $NVIM')
  end
  local servers = mirror.servers()
  if #servers == 0 then
    health.info('none connected (an agent started in a :terminal here, or in this directory, connects on its first call)')
  end
  for _, s in ipairs(servers) do
    health.ok(('MCP server pid %s for %s: %d call%s, cwd %s, channel %d, since %s'):format(
      tostring(s.pid),
      s.client or 'a client that has not called yet',
      s.calls,
      s.calls == 1 and '' or 's',
      tostring(s.cwd),
      s.chan,
      os.date('%H:%M:%S', s.since)
    ))
  end
end

--- A `doc/tags` on 'runtimepath' has the tag `agent_bash`.
function H.help_tagged()
  for _, file in ipairs(vim.api.nvim_get_runtime_file('doc/tags', true)) do
    for _, line in ipairs(vim.fn.readfile(file)) do
      if line:find('^agent_bash\t') then
        return true
      end
    end
  end
  return false
end

function H.ping(health, backend)
  local chan, err = backend.ensure()
  if not chan then
    health.error('could not start the backend: ' .. tostring(err), { 'see the log file for the backend side' })
    return
  end
  local started = vim.uv.hrtime()
  local ok, res = backend.request('ping', {})
  local ms = (vim.uv.hrtime() - started) / 1e6
  if ok and res == 'pong' then
    local info = backend.info()
    health.ok(('ping: pong in %.2f ms (backend %s, pid %s, channel %s)'):format(
      ms,
      tostring(info.version),
      tostring(info.pid),
      tostring(info.chan)
    ))
    if info.version ~= require('agent_bash').version then
      health.warn(
        ('backend version %s differs from the plugin version %s'):format(tostring(info.version), require('agent_bash').version),
        { 'rebuild the backend (cargo build --release) or update the plugin' }
      )
    end
    health.info('artifacts: ' .. tostring(info.session_dir))
    if info.platform then
      health.info('platform: ' .. info.platform)
    end
    if info.tracking then
      health.info('process tracking: ' .. info.tracking)
    end
    if info.fence_ok == false then
      local advice = info.portable
          and 'fenced tool calls are refused: the fence is Linux Landlock, so set sandbox = "off" here'
        or 'fenced tool calls are refused: use a kernel with Landlock (5.13+, `lsm=` including landlock) or set sandbox = "off"'
      health.error('sandbox: ' .. tostring(info.fence), { advice })
    elseif info.fence then
      health.info('sandbox: ' .. info.fence .. ' (bang commands are never fenced)')
    end
    if info.spawn then
      health.info('plain commands: ' .. info.spawn)
    end
    local sok, sh = backend.request('shell_info', {})
    if sok and type(sh) == 'table' then
      local line = ('shell: %s (%s)'):format(tostring(sh.shell), tostring(sh.version))
      if sh.supported then
        health.ok(line)
      else
        health.warn(line .. ': neither bash nor zsh', {
          'commands run without your rc snapshot; set shell = "bash" (or zsh) in the settings',
        })
      end
      health.info('rc snapshot: ' .. tostring(sh.snapshot))
    else
      health.warn('shell: no answer (' .. tostring(sh) .. ')')
    end
    local opts = require('agent_bash.config').options
    if opts.prewarm then
      local said = {
        [true] = 'the bang shell was ready before the first command',
        [false] = 'ran, but started no shell ahead (the bang session was busy, the session limit was reached, or the shell failed: see the log)',
      }
      health.info('prewarm: ' .. (said[info.warmed] or 'not done yet (it runs once a UI attaches)'))
    else
      health.info('prewarm: off')
    end
  else
    health.error('ping failed: ' .. tostring(res), { 'see the log file for the backend side' })
  end
end

return M
