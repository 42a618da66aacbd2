-- mirror.lua: the discovery registry (contract §11) and mirrored runs driven through the card API.
local t = ...

local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
vim.env.XDG_STATE_HOME = dir .. '/state'

local mirror = require('agent_bash.mirror')
local float = require('agent_bash.float')

t.describe('registry', function()
  t.it('lives under $XDG_STATE_HOME/agent-bash/editors', function()
    t.eq(dir .. '/state/agent-bash/editors', mirror.registry_dir())
  end)

  t.it('plugin/ registers this editor with address, pid and cwd, and removes dead editors', function()
    local reg = mirror.registry_dir()
    vim.fn.mkdir(reg, 'p')
    -- an editor that died without unregistering (no such pid)
    vim.fn.writefile({ '{"address":"/gone","pid":999999999,"cwd":"/"}' }, reg .. '/999999999.json')
    if vim.v.servername == '' then
      vim.fn.serverstart()
    end
    -- :cd rewrites the entry (the plugin wrote it after start-up, if it had an address then)
    vim.cmd.cd(dir)
    local mine = reg .. '/' .. vim.fn.getpid() .. '.json'
    local entry = vim.json.decode(table.concat(vim.fn.readfile(mine), '\n'))
    t.eq(vim.v.servername, entry.address)
    t.eq(vim.fn.getpid(), entry.pid)
    t.eq(dir, entry.cwd)
    t.ok(entry.started > 0)
    t.eq(0, vim.fn.filereadable(reg .. '/999999999.json'))
    -- leaving removes it
    vim.api.nvim_exec_autocmds('VimLeavePre', { group = 'agent_bash_registry' })
    t.eq(0, vim.fn.filereadable(mine))
  end)
end)

t.describe('mirrored runs', function()
  t.it('open a labelled card fed by events; cancel reaches the server, not the backend', function()
    local cancelled = {}
    -- a channel that is ours: rpcnotify to it is harmless; record the call instead
    local chan = vim.fn.sockconnect('pipe', vim.v.servername, { rpc = true })
    mirror.hello({ chan = chan, pid = 4242, cwd = '/proj' })
    local orig = vim.rpcnotify
    vim.rpcnotify = function(c, method, params)
      cancelled[#cancelled + 1] = { c, method, params }
    end
    local id = mirror.open({ chan = chan, key = 7, command = 'make test', cwd = vim.fn.getcwd(), client = 'claude-code' })
    local cards = float.cards()
    local card = cards[#cards]
    t.eq(id, card.run.id)
    t.eq('$ make test', vim.api.nvim_buf_get_lines(card.buf, 0, 1, false)[1])
    local title = ''
    for _, chunk in ipairs(vim.api.nvim_win_get_config(card.win).title) do
      title = title .. chunk[1]
    end
    t.ok(title:find('bash (claude-code)', 1, true), title)
    require('agent_bash.runs').on_event({ type = 'update', id = id, lines = { 'compiling' }, hl = {}, total_lines = 1 })
    t.ok(vim.tbl_contains(vim.api.nvim_buf_get_lines(card.buf, 0, -1, false), 'compiling'))
    require('agent_bash.runs').cancel(card.run)
    vim.rpcnotify = orig
    t.eq({ { chan, 'cancel', { key = 7 } } }, cancelled)
    -- the health section lists the server
    t.eq(4242, mirror.servers()[1].pid)
    t.eq('claude-code', mirror.servers()[1].client)
    t.eq(1, mirror.servers()[1].calls)
    vim.fn.chanclose(chan)
  end)
end)
