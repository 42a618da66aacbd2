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
  api().run(o.args, { exclude = o.bang })
end, { nargs = '+', bang = true, complete = 'shellcmd', desc = 'agent-bash: run a shell command (! excludes it from the agent context)' })

command('AgentBashTerm', function(o)
  api().run(o.args, { exclude = o.bang, pty = true })
end, { nargs = '+', bang = true, complete = 'shellcmd', desc = 'agent-bash: run a shell command in a terminal (PTY)' })

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

vim.api.nvim_create_autocmd('BufReadCmd', {
  group = vim.api.nvim_create_augroup('agent_bash_artifact', { clear = true }),
  pattern = 'artifact://*',
  desc = 'agent-bash: read artifact://<id>',
  callback = function(ev)
    require('agent_bash.artifact').read_cmd(ev)
  end,
})

-- The editor mirror (SPEC §11): register this editor so that an MCP server an agent starts in
-- this project can find it and show its commands here. After start-up, so it costs nothing then.
local function register()
  require('agent_bash.mirror').register()
end
if vim.v.vim_did_enter == 1 then
  vim.schedule(register)
else
  vim.api.nvim_create_autocmd('VimEnter', {
    group = vim.api.nvim_create_augroup('agent_bash_mirror_start', { clear = true }),
    once = true,
    desc = 'agent-bash: register for the editor mirror',
    callback = register,
  })
end
