-- config.lua: defaults, merge, validation messages.
local t = ...
local config = require('agent_bash.config')

local function reset()
  config.options = vim.deepcopy(config.defaults)
end

t.describe('config', function()
  t.it('works without setup()', function()
    reset()
    t.eq('<Esc>', config.options.kill_key)
    t.eq(10, config.options.card.collapsed_lines)
    t.eq(20, config.options.card.bang_lines)
    t.eq(nil, config.options.border)
  end)

  t.it('setup() merges nested tables', function()
    reset()
    require('agent_bash').setup({ card = { max_width = 80 }, kill_key = false, border = 'single' })
    t.eq(80, config.options.card.max_width)
    t.eq(10, config.options.card.collapsed_lines)
    t.eq(false, config.options.kill_key)
    t.eq('single', config.options.border)
    config.setup() -- nil is fine and changes nothing
    t.eq(80, config.options.card.max_width)
    reset()
  end)

  local bad = {
    { { card = { max_width = -3 } }, 'agent_bash.setup: card.max_width: expected a positive integer, got -3' },
    { { card = { collapsed_lines = 2.5 } }, 'card.collapsed_lines: expected a positive integer, got 2.5' },
    { { card = 'big' }, 'card: expected table, got "big"' },
    { { kill_key = true }, 'kill_key: expected a key (string) or false, got true' },
    { { kill_key = '' }, 'kill_key: expected a key (string) or false, got ""' },
    { { keys = { close = 1 } }, 'keys.close: expected a key (non-empty string), got 1' },
    { { bin = 42 }, 'bin: expected string, got 42' },
    { { border = 3 }, 'border: expected string|table, got 3' },
    { { log_level = 'loud' }, "log_level: expected 'debug', 'info', 'warn' or 'error', got \"loud\"" },
    { { card = { auto_close = -1 } }, 'card.auto_close: expected milliseconds (number >= 0) or false, got -1' },
    { { cardd = {} }, 'agent_bash.setup: unknown option "cardd"' },
    { { card = { max_widht = 3 } }, 'unknown option "card.max_widht"' },
    { 'x', 'agent_bash.setup: expected a table, got "x"' },
  }
  for _, case in ipairs(bad) do
    t.it('rejects ' .. vim.inspect(case[1], { newline = ' ', indent = '' }), function()
      reset()
      t.raises(function()
        config.setup(case[1])
      end, case[2])
      t.eq(config.defaults, config.options, 'options unchanged after a bad setup()')
    end)
  end

  t.it('error messages carry no file:line noise', function()
    reset()
    local err = t.raises(function()
      config.setup({ card = { bang_lines = 0 } })
    end)
    t.ok(err:find('^[^\n]*agent_bash%.setup: card%.bang_lines'), err)
    t.ok(not err:find('config%.lua'), err)
  end)

  t.it('accepts every good value', function()
    reset()
    config.setup({
      bin = '/usr/bin/agent-bash',
      settings_file = '~/.config/agent-bash.toml',
      kill_key = '<C-c>',
      keys = { close = 'Q', toggle = '<CR>', full_output = 'O' },
      card = { max_width = 60, max_height = 12, collapsed_lines = 5, bang_lines = 8, show_tool_cards = false, auto_close = 3000 },
      border = { '+', '-', '+', '|', '+', '-', '+', '|' },
      icons = { running = 'R' },
      log_level = 'debug',
    })
    t.eq('R', config.options.icons.running)
    t.eq('✓', config.options.icons.done)
    reset()
  end)
end)
