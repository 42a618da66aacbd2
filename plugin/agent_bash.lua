-- agent-bash: user commands, <Plug> mappings and the artifact:// reader.
-- Nothing is required here: every module loads on first use.

if vim.g.loaded_agent_bash then
  return
end
vim.g.loaded_agent_bash = true

local function api()
  return require('agent_bash')
end

local command = vim.api.nvim_create_user_command

-- Completion as for :! (the command, then file names), asked of :! itself. Not a built-in
-- file completion: that would have Neovim expand `%` and `#` in the arguments before we see
-- them (`${#x}`, `${x%.c}`), where our own expansion leaves what is not a file name alone.
local function shell_complete(_, line)
  local rest = line:match('AgentBash%a*!?%s*(.*)$') or ''
  return vim.fn.getcompletion('!' .. rest, 'cmdline')
end

command('AgentBash', function(o)
  api().command(o.args, { exclude = o.bang, range = o.range > 0 and { o.line1, o.line2 } or nil })
end, {
  nargs = '*',
  bang = true,
  range = true,
  complete = shell_complete,
  desc = 'agent-bash: run a shell command (% expands as for :!; no argument: run the last one again; ! excludes it from the agent context)',
})

command('AgentBashTerm', function(o)
  api().command(o.args, { exclude = o.bang, pty = true })
end, { nargs = '*', bang = true, complete = shell_complete, desc = 'agent-bash: run a shell command in a terminal (PTY)' })

command('AgentBashQuickfix', function(o)
  require('agent_bash.quickfix').command(o.args)
end, { nargs = '?', desc = "agent-bash: fill the quickfix list from a finished run's output (default: the newest)" })

command('AgentBashUndo', function(o)
  require('agent_bash.changes').undo_command(o.args)
end, { nargs = '?', desc = 'agent-bash: put back the files a run changed (default: the newest run that changed files)' })

command('AgentBashDiff', function(o)
  require('agent_bash.changes').diff_command(o.args)
end, { nargs = '?', desc = 'agent-bash: the files a run changed, each opening a diff against before the run' })

command('AgentBashHistory', function()
  require('agent_bash.history').pick()
end, { nargs = 0, desc = 'agent-bash: past runs of this session' })

local function complete_runs(lead)
  return require('agent_bash.runs').complete(lead)
end

local function with_id(fn)
  return function(o)
    local id = require('agent_bash.runs').run_id(o.args)
    if vim.trim(o.args) ~= '' and not id then
      vim.notify('agent-bash: expected a run id, got ' .. o.args, vim.log.levels.ERROR)
      return
    end
    fn(id)
  end
end

command('AgentBashCancel', with_id(function(id)
  api().cancel(id)
end), { nargs = '*', complete = complete_runs, desc = 'agent-bash: cancel run [id] (default: the newest running bash command)' })

command('AgentBashFocus', with_id(function(id)
  api().focus(id)
end), { nargs = '*', complete = complete_runs, desc = "agent-bash: move into run [id]'s card or terminal (default: the running terminal, else the newest card)" })

command('AgentBashToggle', function()
  api().toggle()
end, { nargs = 0, desc = 'agent-bash: collapse/expand the newest card' })

command('AgentBashRestart', function()
  api().restart()
end, { nargs = 0, desc = 'agent-bash: restart the backend (it reads the settings file again) once running commands end' })

command('AgentBashClose', with_id(function(id)
  api().close(id)
end), { nargs = '*', complete = complete_runs, desc = "agent-bash: close run [id]'s card or terminal (default: every card and terminal float)" })

command('AgentBashBuild', function()
  require('agent_bash.build').command()
end, { nargs = 0, desc = 'agent-bash: build the backend (cargo build --release in the plugin directory) in a terminal float, then run the command that found no binary' })

local plug = function(name, rhs, desc)
  vim.keymap.set('n', '<Plug>(' .. name .. ')', rhs, { silent = true, desc = 'agent-bash: ' .. desc })
end
plug('AgentBashCancel', function()
  api().cancel()
end, 'cancel the running bash command')
plug('AgentBashHistory', function()
  require('agent_bash.history').pick()
end, 'past runs of this session')
plug('AgentBashFocus', function()
  api().focus()
end, 'move into the newest card')
plug('AgentBashToggle', function()
  api().toggle()
end, 'collapse/expand the newest card')
plug('AgentBashClose', function()
  api().close_all()
end, 'close every card')
vim.keymap.set('n', '<Plug>(AgentBashPrompt)', ':AgentBash ', { desc = 'agent-bash: type a bash command' })

local group = vim.api.nvim_create_augroup('agent_bash_plugin', { clear = true })

-- Help tags: `:help agent_bash` works in a fresh checkout or plugin-manager install. Generated
-- once, after start-up, into doc/ (or a cache directory on 'runtimepath' when doc/ is not
-- writable); checking costs two stat calls.
vim.schedule(function()
  local root = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h:h')
  local txt = vim.uv.fs_stat(root .. '/doc/agent_bash.txt')
  local tags = vim.uv.fs_stat(root .. '/doc/tags')
  if txt and (not tags or tags.mtime.sec < txt.mtime.sec) then
    require('agent_bash.help').generate(root)
  end
end)

-- Cold start: start the backend and the bang shell (its rc snapshot) once the UI is idle.
local function prewarm()
  vim.defer_fn(function()
    require('agent_bash.backend').prewarm()
  end, 100)
end
if vim.v.vim_did_enter == 1 then
  if #vim.api.nvim_list_uis() > 0 then
    prewarm()
  end
else
  vim.api.nvim_create_autocmd('UIEnter', { group = group, once = true, desc = 'agent-bash: prewarm', callback = prewarm })
end

vim.api.nvim_create_autocmd('BufReadCmd', {
  group = vim.api.nvim_create_augroup('agent_bash_artifact', { clear = true }),
  pattern = 'artifact://*',
  desc = 'agent-bash: read artifact://<id>',
  callback = function(ev)
    require('agent_bash.artifact').read_cmd(ev)
  end,
})

-- The editor mirror (contract §11): once started, this editor registers for discovery by the MCP
-- servers agents start (`agent-bash mcp`): `<state>/agent-bash/editors/<pid>.json` with address,
-- pid, cwd; kept current on :cd, removed on exit, entries of dead editors removed. Plain code
-- after start-up, so that starting Neovim loads no module (lua/agent_bash/mirror.lua reads the
-- same directory for :checkhealth). <state> is `$XDG_STATE_HOME`, and the default state directory
-- under `$HOME` as well when that is another one: a server started with a minimal environment
-- (MCP hubs pass on only HOME, PATH, SHELL and TERM) knows no XDG_* and looks there.
local function registry_dirs()
  local default = (vim.env.HOME or '') .. (vim.fn.has('mac') == 1 and '/Library/Application Support' or '/.local/state')
  local base = vim.env.XDG_STATE_HOME
  if base == nil or not base:match('^/') or base == default then
    return { default .. '/agent-bash/editors' }
  end
  return { base .. '/agent-bash/editors', default .. '/agent-bash/editors' }
end

local function register_in(dir, address, pid)
  pcall(function()
    vim.fn.mkdir(dir, 'p', tonumber('700', 8))
    for name in vim.fs.dir(dir) do
      local other = tonumber(name:match('^(%d+)%.json$'))
      if other and other ~= pid then
        local alive, err = vim.uv.kill(other, 0)
        if alive ~= 0 and not tostring(err):match('EPERM') then
          os.remove(dir .. '/' .. name) -- an editor that died without unregistering
        end
      end
    end
    local s, us = vim.uv.gettimeofday()
    vim.g.agent_bash_started_ms = vim.g.agent_bash_started_ms or (s * 1000 + math.floor(us / 1000))
    local entry = { address = address, pid = pid, cwd = vim.fn.getcwd(), started = vim.g.agent_bash_started_ms }
    local path = ('%s/%d.json'):format(dir, pid)
    local f = assert(io.open(path .. '.tmp', 'w'))
    f:write(vim.json.encode(entry))
    f:close()
    assert(os.rename(path .. '.tmp', path))
  end)
end

local function register()
  local address, pid = vim.v.servername, vim.fn.getpid()
  if address == nil or address == '' then
    return
  end
  for _, dir in ipairs(registry_dirs()) do
    register_in(dir, address, pid)
  end
end

local function start_registry()
  local group = vim.api.nvim_create_augroup('agent_bash_registry', { clear = true })
  vim.api.nvim_create_autocmd('DirChanged', { group = group, pattern = 'global', desc = 'agent-bash: keep the discovery entry current', callback = register })
  vim.api.nvim_create_autocmd('VimLeavePre', {
    group = group,
    desc = 'agent-bash: leave the discovery registry',
    callback = function()
      for _, dir in ipairs(registry_dirs()) do
        os.remove(('%s/%d.json'):format(dir, vim.fn.getpid()))
      end
    end,
  })
  register()
end

if vim.v.vim_did_enter == 1 then
  vim.schedule(start_registry)
else
  vim.api.nvim_create_autocmd('VimEnter', { group = vim.api.nvim_create_augroup('agent_bash_registry', { clear = true }), once = true, desc = 'agent-bash: register for the editor mirror', callback = start_registry })
end
