-- The one place that starts and talks to the backend (`agent-bash nvim`, msgpack-RPC over
-- stdio). Started lazily on first use, restarted on the next call after a crash, stopped on
-- VimLeavePre (the backend kills its processes when its stdin closes). Every call is logged.

local M = {}
local H = {}

local log = require('agent_bash.log')

---@class agent_bash.BackendInfo
---@field chan? integer
---@field bin? string
---@field version? string backend version from `hello`
---@field pid? integer
---@field session_dir? string
---@field session_id? string
---@field warmed? boolean true: the prewarmed bang shell is ready; false: the warm-up ran but started no shell
---@field changes? boolean change receipts (contract §13) are on in the backend's settings
---@field changes_watch? boolean receipts watch the projects' folders (`[changes] watch`)
---@field git? string the git program receipts run (`[changes] git`, else `git`)
---@field fence? string the sandbox of tool calls and the kernel's Landlock support
---@field fence_ok? boolean false when tool calls are to be fenced but the kernel cannot
---@field spawn? string whether plain commands start without bash's fork (the spawn builtin)
---@field platform? string the system and which of its paths run (`Linux`, `macOS (portable paths)`)
---@field portable? boolean the portable paths run (not Linux, or AGENT_BASH_PORTABLE=1)
---@field tracking? string how a command's processes are tracked and killed (cgroup v2, subreapers, process groups)

--- Starts the backend unless it runs. Returns the channel, or nil and an error message.
---@return integer? chan
---@return string? err
function M.ensure()
  if H.chan then
    return H.chan
  end
  return H.start()
end

--- A quick request (blocks the editor until answered; use only for quick queries).
--- Returns true and the result, or false and the error message without RPC decoration.
---@param method string
---@param params table
---@return boolean ok
---@return any result_or_err
function M.request(method, params)
  local chan, err = M.ensure()
  if not chan then
    return false, err
  end
  log.debug('request %s %s', method, vim.inspect(params, { newline = ' ', indent = '' }))
  local ok, res = pcall(vim.rpcrequest, chan, method, params)
  if not ok then
    res = M.error_text(res)
    log.debug('request %s failed: %s', method, res)
  end
  return ok, res
end

--- A notification to the running backend only: never starts one (keys typed into a terminal
--- and resizes mean nothing to a new backend). Returns false when no backend runs.
---@param method string
---@param params table
---@return boolean ok
function M.send(method, params)
  local chan = H.chan
  if not chan then
    log.debug('send %s dropped: no backend', method)
    return false
  end
  if method == 'pty_input' then
    -- Keys typed into a terminal (passwords too) never reach the log: only their count.
    log.debug('send pty_input to run %s (%d bytes)', tostring(params.id), #(params.data or ''))
  else
    log.debug('send %s %s', method, vim.inspect(params, { newline = ' ', indent = '' }))
  end
  return (pcall(vim.rpcnotify, chan, method, params))
end

--- A notification (returns at once). Returns true, or false and an error message.
---@param method string
---@param params table
---@return boolean ok
---@return string? err
function M.notify(method, params)
  local chan, err = M.ensure()
  if not chan then
    return false, err
  end
  log.debug('notify %s %s', method, vim.inspect(params, { newline = ' ', indent = '' }))
  local ok, res = pcall(vim.rpcnotify, chan, method, params)
  if not ok then
    return false, M.error_text(res)
  end
  return true
end

--- Stops the backend (its stdin closes; it kills what it started and exits).
function M.stop()
  local chan = H.chan
  H.chan = nil
  if chan then
    log.info('stopping backend (channel %d)', chan)
    H.stopping[chan] = true
    pcall(vim.fn.jobstop, chan)
  end
end

--- Why the last start failed, in the backend's own words (nil after a successful start).
---@return string?
function M.start_error()
  return H.start_error
end

--- Restarts the backend so that it reads its settings again (`:AgentBashRestart`, `setup()`
--- with another `settings_file`). Commands it runs are not cut short: the restart waits until
--- they end, and says which it waits for. Returns true when it restarted now.
---@param opts? {quiet?: boolean} quiet: say nothing on success
---@return boolean
function M.restart(opts)
  local waiting = vim.tbl_filter(function(run)
    return not run.remote_cancel
  end, require('agent_bash.runs').running())
  if H.chan and #waiting > 0 then
    H.restart_pending = opts or {}
    local names = vim.tbl_map(function(run)
      return '$ ' .. run.state.command
    end, waiting)
    vim.notify(
      ('agent-bash: the backend restarts once %d running command%s end%s: %s'):format(
        #waiting,
        #waiting == 1 and '' or 's',
        #waiting == 1 and 's' or '',
        table.concat(names, ', ')
      ),
      vim.log.levels.INFO
    )
    return false
  end
  H.restart_pending = nil
  M.stop()
  H.warm_sent = false
  local chan, err = M.ensure()
  if not chan then
    vim.notify('agent-bash: the backend did not start: ' .. tostring(err), vim.log.levels.ERROR)
  elseif not (opts and opts.quiet) then
    local settings = require('agent_bash.config').options.settings_file
    vim.notify(
      ('agent-bash: backend restarted (%s)'):format(settings and ('settings: ' .. settings) or 'no settings file'),
      vim.log.levels.INFO
    )
  end
  return chan ~= nil
end

--- A run ended: a restart that waited for running commands happens once none is left.
function M._on_run_end()
  if not H.restart_pending then
    return
  end
  local left = vim.tbl_filter(function(run)
    return not run.remote_cancel
  end, require('agent_bash.runs').running())
  if #left == 0 then
    local opts = H.restart_pending
    vim.schedule(function()
      if H.restart_pending then
        M.restart(opts)
      end
    end)
  end
end

--- What is known about the running backend (empty fields when it is not running).
---@return agent_bash.BackendInfo
function M.info()
  return vim.tbl_extend('force', {}, H.info, { chan = H.chan, session_id = M.session_id() })
end

--- The editor session's id, passed as `--session-id`: one per Neovim instance, so a backend
--- restarted after a crash keeps the session's artifacts and record. Only [A-Za-z0-9._-].
---@return string
function M.session_id()
  if not H.session_id then
    local id = os.date('%Y%m%d-%H%M%S') .. '-' .. vim.fn.getpid()
    H.session_id = (id:gsub('[^%w._-]', '_'))
  end
  return H.session_id
end

--- The backend binary: config `bin`, else <plugin root>/target/release/agent-bash, else
--- `agent-bash` on $PATH. Returns nil and the places looked at when none is executable.
---@return string? bin
---@return string? err
function M.bin()
  local configured = require('agent_bash.config').options.bin
  if configured then
    local bin = vim.fn.expand(configured)
    if vim.fn.executable(bin) == 1 then
      return bin
    end
    return nil, ('agent-bash binary is not executable: %s (option `bin`)'):format(bin)
  end
  local local_build = M.root() .. '/target/release/agent-bash'
  if vim.fn.executable(local_build) == 1 then
    return local_build
  end
  if vim.fn.executable('agent-bash') == 1 then
    return vim.fn.exepath('agent-bash')
  end
  -- How to build it depends on how the plugin was installed (lua/agent_bash/build.lua).
  return nil, require('agent_bash.build').missing(local_build)
end

--- The plugin's root: the directory holding lua/agent_bash.
---@return string
function M.root()
  local src = debug.getinfo(1, 'S').source:gsub('^@', '')
  return vim.fn.fnamemodify(src, ':p:h:h:h')
end

--- The one state directory (sessions, artifacts, change receipts, the registry of editors):
--- `$XDG_STATE_HOME/agent-bash`, the directory `agent-bash mcp`/`rpc`/`exec` use too.
---@return string
function M.state_dir()
  return vim.fn.fnamemodify(require('agent_bash.mirror').registry_dir(), ':h')
end

--- Where versions before 0.2 kept the editor's state (`stdpath('state')/agent_bash`).
---@return string
function M.old_state_dir()
  return vim.fn.stdpath('state') .. '/agent_bash'
end

--- Moves what is in `old` into `new`, merging directories both have; an entry whose name is
--- taken by a file in `new` stays in `old`. Empty directories left in `old` are removed.
--- Returns the paths left behind (relative to `old`).
---@param old string
---@param new string
---@return string[] left
function M.migrate_state(old, new)
  local left = {}
  local function merge(from, to, rel)
    if vim.fn.isdirectory(to) == 0 then
      vim.fn.mkdir(to, 'p', tonumber('700', 8))
    end
    for name, kind in vim.fs.dir(from) do
      local src, dst, r = from .. '/' .. name, to .. '/' .. name, rel .. name
      local there = vim.uv.fs_lstat(dst)
      if not there then
        if not vim.uv.fs_rename(src, dst) then
          left[#left + 1] = r
        end
      elseif kind == 'directory' and there.type == 'directory' then
        merge(src, dst, r .. '/')
      else
        left[#left + 1] = r
      end
    end
    vim.uv.fs_rmdir(from) -- only when empty
  end
  if vim.fn.isdirectory(old) == 1 then
    merge(old, new, '')
    if #left > 0 then
      log.warn('state: left in %s (taken in %s): %s', old, new, table.concat(left, ', '))
    else
      log.info('state: moved %s into %s', old, new)
    end
  end
  return left
end

--- The argv used to start the backend.
---@param bin string
---@return string[]
function M.argv(bin)
  local argv = { bin, '--log-file', log.file(), 'nvim' }
  local settings = require('agent_bash.config').options.settings_file
  if settings then
    vim.list_extend(argv, { '--config', vim.fn.expand(settings) })
  end
  vim.list_extend(argv, { '--state-dir', M.state_dir() })
  vim.list_extend(argv, { '--session-id', M.session_id() })
  return argv
end

--- Strips Neovim's RPC error decoration ("Error invoking 'x' on channel N:\n…") so the
--- backend's exact text remains.
---@param err any
---@return string
function M.error_text(err)
  if type(err) == 'table' then
    err = err[2] or err.message or vim.inspect(err)
  end
  local s = tostring(err)
  s = s:gsub('^Vim:', '')
  s = s:match("^Error invoking '[^']*' on channel %d+[^\n]*:\n(.*)$") or s
  s = s:gsub('^[^%s]+%.lua:%d+: ', '')
  return vim.trim(s)
end

--- msgpack nil arrives as vim.NIL inside tables; absent is what the code means. Changes `v`
--- in place and returns it.
---@generic T
---@param v T
---@return T
function M.denil(v)
  if v == vim.NIL then
    return nil
  end
  if type(v) == 'table' then
    for k, x in pairs(v) do
      v[k] = M.denil(x)
    end
  end
  return v
end

--- Cold start (option `prewarm`): starts the backend and asks it to start the bang shell (and
--- take the rc snapshot) in the background, so the first `:AgentBash` finds both ready.
--- `info().warmed` becomes true when the shell is ready (false when none could be started
--- ahead: the bang session was busy, the session limit was reached, or the shell failed).
function M.prewarm()
  if not require('agent_bash.config').options.prewarm or H.warm_sent then
    return
  end
  if not M.bin() then
    return -- nothing to start; the first command reports it
  end
  H.warm_sent = true
  local ok, err = M.notify('warm', {})
  if not ok then
    log.warn('prewarm: %s', tostring(err))
  end
end

--- Called by the backend (nvim_exec_lua) for every event: update, done, error, waiting,
--- `warmed` (the prewarmed shell is ready) and protocol_error (a notification it refused, shown
--- to the user). Handled on the next tick so errors here never travel back to the backend.
---@param ev table
function M._on_event(ev)
  if type(ev) == 'table' and ev.type == 'protocol_error' then
    -- A notification the backend could not act on (it has no answer to carry the error).
    vim.schedule(function()
      log.error('backend refused a message: %s', tostring(ev.message))
      vim.notify('agent-bash: ' .. tostring(ev.message), vim.log.levels.ERROR)
    end)
    return
  end
  if type(ev) == 'table' and ev.type == 'warmed' then
    H.info.warmed = ev.ready == true
    log.info('backend warm-up done in %s ms (shell ready: %s)', tostring(ev.ms), tostring(ev.ready))
    return
  end
  vim.schedule(function()
    local ok, err = pcall(require('agent_bash.runs').on_event, ev)
    if not ok then
      log.error('event %s for run %s: %s', tostring(ev and ev.type), tostring(ev and ev.id), err)
    end
  end)
end

-- Helpers -----------------------------------------------------------------------------------

H.chan = nil ---@type integer?
H.session_id = nil ---@type string?
H.info = {} ---@type agent_bash.BackendInfo
H.stopping = {} ---@type table<integer, boolean>
H.warned_version = false
H.warm_sent = false
H.leaving = false
H.start_error = nil ---@type string?
H.restart_pending = nil ---@type table?

function H.start()
  local bin, err = M.bin()
  if not bin then
    log.error('%s', err)
    return nil, err
  end
  H.autocmds()
  if not H.migrated then
    H.migrated = true
    M.migrate_state(M.old_state_dir(), M.state_dir())
  end
  local argv = M.argv(bin)
  log.info('starting backend: %s', table.concat(argv, ' '))
  -- What the backend says on stderr before it dies (a settings file it refuses, a bad flag)
  -- becomes the error the user sees, instead of a closed channel.
  local stderr = {}
  local ok, chan = pcall(vim.fn.jobstart, argv, {
    rpc = true,
    on_stderr = function(_, data)
      H.collect(stderr, data)
    end,
    on_exit = function(job, code)
      H.on_exit(job, code)
    end,
  })
  if not ok or type(chan) ~= 'number' or chan <= 0 then
    local msg = ('could not start %s: %s'):format(bin, ok and ('jobstart returned ' .. tostring(chan)) or chan)
    log.error('%s', msg)
    return nil, msg
  end
  local version = require('agent_bash').version
  local hok, hello = pcall(vim.rpcrequest, chan, 'hello', { version = version })
  if not hok or type(hello) ~= 'table' then
    H.stopping[chan] = true
    -- A backend that exits at start wrote why on stderr: wait for it (bounded) and say that.
    vim.fn.jobwait({ chan }, 2000)
    pcall(vim.fn.jobstop, chan)
    local said = H.stderr_text(stderr)
    local msg = said
      or ('backend did not answer hello: %s'):format(hok and vim.inspect(hello) or M.error_text(hello))
    log.error('%s', msg)
    H.start_error = msg
    return nil, msg
  end
  H.start_error = nil
  H.chan = chan
  H.info = {
    bin = bin,
    version = hello.version,
    pid = hello.pid,
    session_dir = hello.session_dir,
    fence = hello.fence,
    fence_ok = hello.fence_ok,
    changes = hello.changes,
    changes_watch = hello.changes_watch,
    git = hello.git,
    spawn = hello.spawn,
    platform = hello.platform,
    portable = hello.portable,
    tracking = hello.tracking,
  }
  log.info('backend %s (pid %s) on channel %d, artifacts in %s', tostring(hello.version), tostring(hello.pid), chan, tostring(hello.session_dir))
  if hello.version ~= version and not H.warned_version then
    H.warned_version = true
    vim.notify(
      ('agent-bash: backend version %s differs from the plugin version %s; rebuild the backend or update the plugin'):format(
        tostring(hello.version),
        version
      ),
      vim.log.levels.WARN
    )
  end
  return chan
end

--- Appends a job's output chunks (`on_stderr` data: the first item continues the last line).
function H.collect(acc, data)
  if #acc > 200 then
    return -- bounded: the first lines say why
  end
  if #acc > 0 and data[1] then
    acc[#acc] = acc[#acc] .. data[1]
    table.remove(data, 1)
  end
  vim.list_extend(acc, data)
end

--- The backend's own words from its stderr, without the program-name prefix; nil when silent.
function H.stderr_text(acc)
  local text = vim.trim(table.concat(acc, '\n'))
  if text == '' then
    return nil
  end
  return (text:gsub('^agent%-bash: ', ''))
end

function H.on_exit(chan, code)
  log.info('backend on channel %d exited with code %d', chan, code)
  local expected = H.stopping[chan] or H.leaving
  H.stopping[chan] = nil
  if H.chan == chan then
    H.chan = nil
    H.info = {}
  end
  if expected then
    return
  end
  vim.notify(
    ('agent-bash: backend exited (code %d); it restarts on the next command. Log: %s'):format(code, log.file()),
    vim.log.levels.WARN
  )
  require('agent_bash.runs').on_backend_exit(code)
end

function H.autocmds()
  if H.augroup then
    return
  end
  H.augroup = vim.api.nvim_create_augroup('agent_bash_backend', { clear = true })
  vim.api.nvim_create_autocmd('VimLeavePre', {
    group = H.augroup,
    desc = 'agent-bash: stop the backend',
    callback = function()
      H.leaving = true
      M.stop()
    end,
  })
end

return M
