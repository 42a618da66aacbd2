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

command('AgentBash', function(o)
  api().command(o.args, { exclude = o.bang })
end, {
  nargs = '*',
  bang = true,
  complete = 'shellcmd',
  desc = 'agent-bash: run a shell command (% expands as for :!; no argument: run the last one again; ! excludes it from the agent context)',
})

command('AgentBashTerm', function(o)
  api().command(o.args, { exclude = o.bang, pty = true })
end, { nargs = '*', bang = true, complete = 'shellcmd', desc = 'agent-bash: run a shell command in a terminal (PTY)' })

command('AgentBashQuickfix', function(o)
  require('agent_bash.quickfix').command(o.args)
end, { nargs = '?', desc = "agent-bash: fill the quickfix list from a finished run's output (default: the newest)" })

command('AgentBashHistory', function()
  require('agent_bash.history').pick()
end, { nargs = 0, desc = 'agent-bash: past runs of this session' })

command('AgentBashCancel', function()
  api().cancel()
end, { nargs = 0, desc = 'agent-bash: cancel the running bash command' })

command('AgentBashFocus', function()
  api().focus()
end, { nargs = 0, desc = 'agent-bash: move into the newest card' })

command('AgentBashToggle', function()
  api().toggle()
end, { nargs = 0, desc = 'agent-bash: collapse/expand the newest card' })

command('AgentBashClose', function()
  api().close_all()
end, { nargs = 0, desc = 'agent-bash: close every card' })

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
