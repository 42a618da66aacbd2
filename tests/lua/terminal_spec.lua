-- Terminal floats for PTY runs (terminal.lua) against tests/lua/fake_backend.lua, which acts out
-- the backend's half: it calls terminal._open, writes into the channel, echoes pty_input.
-- Typed keys cannot reach a headless terminal from a script, so on_input is called directly.
local t = ...

local dir = vim.fn.tempname()
vim.fn.mkdir(dir, 'p')
vim.env.XDG_STATE_HOME = dir .. '/state'
local bin = dir .. '/agent-bash'
vim.fn.writefile({
  '#!/bin/sh',
  ('exec %s -ll %s "$@"'):format(vim.fn.shellescape(vim.v.progpath), vim.fn.shellescape(t.root .. '/tests/lua/fake_backend.lua')),
}, bin)
vim.fn.setfperm(bin, 'rwxr-xr-x')

local ab = require('agent_bash')
local backend = require('agent_bash.backend')
local runs = require('agent_bash.runs')
local float = require('agent_bash.float')
local terminal = require('agent_bash.terminal')
ab.setup({ bin = bin })
vim.o.lines, vim.o.columns = 40, 120

local notes = {}
vim.notify = function(msg, level)
  notes[#notes + 1] = { msg, level }
end

-- on_input of each terminal channel, and the options it was opened with
local opened = {}
local open_term = vim.api.nvim_open_term
vim.api.nvim_open_term = function(buf, opts)
  local chan = open_term(buf, opts)
  opened[chan] = { opts = opts, current_buf = vim.api.nvim_get_current_buf() }
  return chan
end

-- every notification sent to the backend (passed on to it)
local sent = {}
local rpcnotify = vim.rpcnotify
vim.rpcnotify = function(chan, method, params)
  sent[#sent + 1] = { method, params }
  return rpcnotify(chan, method, params)
end

local function lines(buf)
  return vim.api.nvim_buf_get_lines(buf, 0, -1, false)
end

local function sent_of(method)
  local out = {}
  for _, s in ipairs(sent) do
    if s[1] == method then
      out[#out + 1] = s[2]
    end
  end
  return out
end

local function map(buf, mode, lhs)
  local m = vim.api.nvim_buf_call(buf, function()
    return vim.fn.maparg(lhs, mode, false, true)
  end)
  t.ok(m.callback, ('no %s mapping for %s'):format(mode, lhs))
  return m
end

local function start_term(cmd)
  vim.cmd('AgentBashTerm ' .. cmd)
  local run = runs.bang()
  t.ok(run, 'no bang run')
  t.wait(function()
    return run.term ~= nil
  end, 2000, 'the backend to open a terminal')
  return run, run.term
end

local function chunks(list)
  return vim.tbl_map(function(c)
    return c[1]
  end, list)
end

t.describe(':AgentBashTerm', function()
  local run, term

  t.it('sends run with pty = true and opens a focused terminal float', function()
    local before = vim.api.nvim_get_current_win()
    run, term = start_term('pty-sleep')
    t.eq(nil, run.card, 'a PTY run shows its terminal, not a card')
    local _, last = backend.request('last_run', {})
    t.eq({ true, 'bang', 'pty-sleep', false }, { last.pty, last.origin, last.command, last.exclude_from_context })
    t.eq(term.win, vim.api.nvim_get_current_win())
    t.ok(before ~= term.win)
    t.eq('terminal', vim.bo[term.buf].buftype)
    t.eq('agent_bash_term', vim.bo[term.buf].filetype)
    t.eq(term.buf, vim.api.nvim_get_chan_info(term.chan).buffer)
    t.eq(false, opened[term.chan].opts.force_crlf)
    t.eq(term.buf, opened[term.chan].current_buf, 'terminal created with its buffer current (#37579)')
    local cfg = vim.api.nvim_win_get_config(term.win)
    t.eq({ 'editor', 96, 30, terminal.ZINDEX }, { cfg.relative, cfg.width, cfg.height, cfg.zindex })
    t.eq({ ' ● ', '$ pty-sleep · running · 0s ' }, chunks(cfg.title))
    t.eq({ ' <C-\\><C-k> kill · <C-\\><C-n> normal mode · q close ' }, chunks(cfg.footer))
  end)

  t.it('_open answered the channel and the window size; the backend writes into it', function()
    local _, log = backend.request('pty_log', {})
    t.eq({ { chan = term.chan, cols = 96, rows = 30 } }, log.opened)
    t.wait(function()
      return lines(term.buf)[1] == 'hello from pty'
    end, 2000, 'the PTY bytes')
  end)

  t.it('typed keys go to the backend as pty_input', function()
    opened[term.chan].opts.on_input('input', term.chan, term.buf, 'ls\r')
    t.eq({ { id = run.id, data = 'ls\r' } }, sent_of('pty_input'))
    t.wait(function()
      return lines(term.buf)[2] == 'ls'
    end, 2000, 'the echo')
  end)

  t.it('resizes send pty_resize once per change (WinResized, VimResized)', function()
    vim.api.nvim_win_set_config(term.win, { width = 50, height = 10 })
    vim.api.nvim_exec_autocmds('WinResized', {})
    vim.api.nvim_exec_autocmds('WinResized', {})
    t.eq({ { id = run.id, cols = 50, rows = 10 } }, sent_of('pty_resize'))
    vim.o.columns = 100
    vim.api.nvim_exec_autocmds('VimResized', {})
    t.eq({ id = run.id, cols = 80, rows = 30 }, sent_of('pty_resize')[2])
    t.eq(80, vim.api.nvim_win_get_config(term.win).width)
    vim.o.columns = 120
    vim.api.nvim_exec_autocmds('VimResized', {})
    local _, log = backend.request('pty_log', {})
    t.eq(3, #log.resize)
  end)

  t.it('a second bang command runs beside it, in a card of its own', function()
    notes = {}
    vim.cmd('AgentBash echo hi')
    t.eq({}, notes)
    local card = float.cards()[1]
    t.ok(card and card.run ~= run)
    t.wait(function()
      return card.run.finished
    end)
    t.eq(false, term.finished, 'the terminal run goes on')
    ab.close_all()
  end)

  t.it('the kill chord sends cancel; <Esc> goes to the program; the float then shows the status and the keys', function()
    local esc = vim.api.nvim_buf_call(term.buf, function()
      return vim.fn.maparg('<Esc>', 't', false, true)
    end)
    t.eq(nil, esc.lhs, '<Esc> is not mapped in the terminal')
    local kill = map(term.buf, 't', '<C-\\><C-k>')
    t.eq(1, kill.expr)
    t.eq('', kill.callback())
    t.eq({ { id = run.id } }, sent_of('cancel'))
    t.wait(function()
      return term.finished
    end, 2000, 'the cancelled run to end')
    local cfg = vim.api.nvim_win_get_config(term.win)
    t.eq({ ' ⊘ ', '$ pty-sleep · cancelled · 3ms ' }, chunks(cfg.title))
    t.eq({ ' <Tab> card · q close ' }, chunks(cfg.footer))
    t.eq('<C-\\><C-n>', kill.callback(), 'once ended, the kill key leaves terminal mode')
    opened[term.chan].opts.on_input('input', term.chan, term.buf, 'x')
    t.eq(1, #sent_of('pty_input'), 'no input after the end')
  end)

  t.it('<Tab> switches to the card of the model-facing text', function()
    map(term.buf, 'n', '<Tab>').callback()
    t.eq(false, vim.api.nvim_buf_is_valid(term.buf))
    t.eq(nil, terminal.get(run.id))
    t.ok(run.card)
    t.eq(run.card.win, vim.api.nvim_get_current_win())
    t.eq({ '$ pty-sleep', 'zzz', '(cancelled)' }, lines(run.card.buf))
    ab.close_all()
  end)
end)

t.describe('terminal', function()
  t.it('closing a running terminal keeps it; :AgentBashFocus shows it again', function()
    local run, term = start_term('pty-sleep')
    local before = term.prev_win
    map(term.buf, 'n', 'q').callback()
    t.eq(nil, term.win)
    t.eq(before, vim.api.nvim_get_current_win())
    t.ok(vim.api.nvim_buf_is_valid(term.buf), 'the buffer lives while the command runs')
    vim.cmd('AgentBashFocus')
    t.ok(term.win and vim.api.nvim_win_is_valid(term.win))
    t.eq(term.win, vim.api.nvim_get_current_win())
    t.eq(term.buf, vim.api.nvim_win_get_buf(term.win))
    vim.cmd('AgentBashCancel')
    t.wait(function()
      return run.finished
    end)
    map(term.buf, 'n', 'q').callback()
    t.eq(false, vim.api.nvim_buf_is_valid(term.buf), 'a finished terminal is wiped when closed')
  end)

  t.it('a tool call run in a PTY: the terminal replaces its card, without taking focus', function()
    local win = vim.api.nvim_get_current_win()
    local done
    ab.tool_call({ command = 'pty-echo' }, {
      on_done = function(r)
        done = r
      end,
    })
    t.wait(function()
      return done ~= nil
    end)
    local _, last = backend.request('last_run', {})
    t.eq({ false, 'tool' }, { last.ui, last.origin }, 'headless: no UI attached')
    t.eq(nil, last.pty)
    t.eq(win, vim.api.nvim_get_current_win())
    t.eq(0, #float.cards(), 'the tool card gave way to the terminal')
    local term
    for _, x in pairs(terminal.terms()) do
      term = x
    end
    t.ok(term and term.finished)
    t.eq({ ' ✓ ', '$ pty-echo · done · 3ms ' }, chunks(vim.api.nvim_win_get_config(term.win).title))
    t.eq('hello from pty\n', done.output)
    terminal.close(term)
    t.eq(nil, next(terminal.terms()))
  end)

  t.it('a PTY run that gets no terminal shows a card instead', function()
    vim.cmd('AgentBashTerm echo hi') -- the fake runs it with pipes
    local card = float.cards()[1]
    -- The finished card (a live update shows `hi` above a `Running…` line first).
    t.wait(function()
      card = float.cards()[1]
      return card and card.run.finished and lines(card.buf)[2] == 'hi'
    end)
    t.eq({ '$ echo hi', 'hi' }, lines(card.buf))
    ab.close_all()
    vim.cmd('AgentBashTerm badcwd')
    t.wait(function()
      card = float.cards()[1]
      return card ~= nil and runs.bang() == nil
    end)
    t.eq({ '$ badcwd', 'Bash command failed: Working directory does not exist: /nope' }, lines(card.buf))
    ab.close_all()
  end)

  t.it('term_kill_key = false: no kill chord', function()
    ab.setup({ term_kill_key = false })
    local run, term = start_term('pty-sleep')
    local m = vim.api.nvim_buf_call(term.buf, function()
      return vim.fn.maparg('<C-\\><C-k>', 't', false, true)
    end)
    t.eq(nil, m.lhs)
    t.eq({ ' <C-\\><C-n> normal mode · q close ' }, chunks(vim.api.nvim_win_get_config(term.win).footer))
    ab.cancel()
    t.wait(function()
      return run.finished
    end)
    terminal.close(term)
    ab.setup({ term_kill_key = '<C-\\><C-k>' })
  end)

  t.it('_open validates its arguments', function()
    t.raises(function()
      terminal._open(99, { command = 'x', origin = 'agent' })
    end, "opts.origin: expected 'bang' or 'tool'")
  end)

  t.it('a terminal for a run Lua does not know still opens', function()
    local res = terminal._open(1000, { command = 'orphan', origin = 'tool' })
    local term = terminal.get(1000)
    t.eq({ chan = term.chan, cols = 96, rows = 30 }, res)
    t.eq({ ' ● ', '$ orphan · running ' }, chunks(vim.api.nvim_win_get_config(term.win).title))
    map(term.buf, 't', '<C-\\><C-k>').callback()
    t.eq({ id = 1000 }, sent_of('cancel')[#sent_of('cancel')])
    terminal.finish(term)
    terminal.close(term)
    backend.stop()
  end)
end)
